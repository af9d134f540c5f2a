#!/usr/bin/env bash
# OODSelect end to end on a ColoredMNIST zoo (test env 0 only): train N runs (mlp arch,
# diverse algorithms and hparams seeds), then OODSelect on OOD env 0 with random/hard
# baselines, then the composition of the selected subsets (groups y{0,1}_{red,green}:
# colour agrees with the label iff y0_red/y1_green... see below, and label noise).
#   bash scripts/oodselect_e2e.sh [OUT_DIR] [N_RUNS] [STEPS] [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/oodselect_e2e}; N=${2:-40}; STEPS=${3:-120}; JOBS=${4:-2}
DATA=${DATA_DIR:-/tmp/e2e_data}; mkdir -p "$DATA" "$OUT/sweep"
FREQ=$(( STEPS / 5 ))
ALGS=(ERM IRM GroupDRO VREx)
T0=$(date +%s)
for i in $(seq 1 "$N"); do
  alg=${ALGS[$(( (i - 1) % ${#ALGS[@]} ))]}
  d="$OUT/sweep/${alg}_h${i}"
  [ -f "$d/done" ] && continue
  echo "python -m domainbed.scripts.train --dataset ColoredMNIST --algorithm $alg --data_dir $DATA --output_dir $d --test_envs 0 --hparams_seed $i --trial_seed $(( i % 3 )) --seed $i --hparams '{\"arch\":\"mlp\"}' --steps $STEPS --checkpoint_freq $FREQ --num_threads 1 --skip_model_save > $d.log 2>&1 || echo FAILED $d"
done | xargs -d "\n" -P "$JOBS" -I{} bash -c "{}"
T1=$(date +%s)
echo "training: $N runs in $(( T1 - T0 )) s (wall)"
python scripts/oodselect_sweep_demo.py "$OUT/sweep" --dataset ColoredMNIST --ood_env 0 \
  --sizes 10 25 50 100 250 500 --steps 1500 --patience 300 --random_draws 100 \
  --output_dir "$OUT/select" 2>"$OUT/select.log" | tee "$OUT/select_report.txt"
T2=$(date +%s)
echo "OODSelect: $(( T2 - T1 )) s (wall); total $(( T2 - T0 )) s"
python - "$OUT" "$DATA" <<'PY'
import glob, os, sys
import numpy as np, pandas as pd
from domainbed.results.records import list_prediction_steps, load_predictions
out, data = sys.argv[1], sys.argv[2]
run = sorted(glob.glob(os.path.join(out, "sweep", "*_h*/")))[0]
p = load_predictions(run, list_prediction_steps(run)[-1])
m = p["env"] == 0
ex = pd.DataFrame({"id": p["id"][m], "split": p["split"][m], "label": p["label"][m],
                   "group": p["group"][m]})
names = ["y0_red", "y0_green", "y1_red", "y1_green"]
ex["group_name"] = [names[g] for g in ex.group]
# colour index c: group = 2*y + c (as OoDBench's); colour == label <=> group in {0, 3}
ex["colour_agrees"] = ex.group.isin([0, 3])
try:
    from domainbed.datasets.mnist import load_mnist_digits
    digits = np.asarray(load_mnist_digits(data)[1])
    ex["clean_label"] = (digits[ex.id.to_numpy()] < 5).astype(int)
    ex["label_noise"] = ex.clean_label != ex.label
except Exception as e:  # noqa: BLE001
    print("label noise unavailable:", e)
def describe(df, name):
    s = f"{name}: n={len(df)} colour!=label {100 * (~df.colour_agrees).mean():.0f}%"
    if "label_noise" in df:
        s += f", label noise {100 * df.label_noise.mean():.0f}%"
    s += "; groups " + ", ".join(f"{k}={v}" for k, v in df.group_name.value_counts().sort_index().items())
    print(s)
describe(ex, "OOD env 0 (pool)")
for f in sorted(glob.glob(os.path.join(out, "select", "subset_*.csv")),
                key=lambda f: int(f.split("_")[-1][:-4])):
    sub = pd.read_csv(f)
    key = sub.merge(ex.drop_duplicates("id"), on="id", how="left", suffixes=("_s", ""))
    describe(key, os.path.basename(f))
PY
