#!/usr/bin/env bash
# analysis end to end: small sweeps on five offline group-annotated benchmarks
# (ColoredMNIST test env 2; OoDBenchColoredMNIST with four colour-flip settings),
# three methods (ERM, ReweightedERM, IRM: GroupDRO equals ERM with one training env), K reference runs, then aotl per-ood table + plots and
# the validity report, checking every cell of the report is a finite number.
# Convergent Validity is a fit of agreement on |dK| over >= max(--cv_min_pairs (3), 2)
# comparison benchmarks, so it needs >= 4 benchmarks by default whose methods' WG
# accuracies are not all tied (a tie makes the agreement correlation NaN).
#   bash scripts/analysis_e2e.sh [OUT_DIR] [STEPS] [JOBS]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/analysis_e2e}; STEPS=${2:-80}; JOBS=${3:-1}
DATA=${DATA_DIR:-/tmp/e2e_data}; mkdir -p "$DATA" "$OUT/sweep" "$OUT/kref"
FREQ=$(( STEPS / 4 ))
T0=$(date +%s)
# benchmark spec: name|dataset|test env|data seed|extra hparams (JSON fragment)
BENCHES=(
  'cmnist|ColoredMNIST|2|0|'
  'oodb_strong|OoDBenchColoredMNIST|1|1|,"cmnist_rho_tr":0.1,"cmnist_rho_te":0.9'
  'oodb_mild|OoDBenchColoredMNIST|1|2|,"cmnist_rho_tr":0.25,"cmnist_rho_te":0.75'
  'oodb_half|OoDBenchColoredMNIST|1|3|,"cmnist_rho_tr":0.15,"cmnist_rho_te":0.5'
  'oodb_low|OoDBenchColoredMNIST|1|4|,"cmnist_rho_tr":0.3,"cmnist_rho_te":0.9'
)
{
for b in "${BENCHES[@]}"; do
  IFS='|' read -r name ds env dseed extra <<<"$b"
  hp="{\"arch\":\"mlp\"$extra}"
  mkdir -p "$OUT/sweep/$name"
  for alg in ERM ReweightedERM IRM; do
    for ts in 0 1; do
      d="$OUT/sweep/$name/${alg}_s$ts"
      [ -f "$d/done" ] || echo "python -m domainbed.scripts.train --dataset $ds --algorithm $alg --data_dir $DATA --output_dir $d --test_envs $env --hparams_seed 0 --trial_seed $ts --seed $ts --data_seed $dseed --hparams '$hp' --steps $STEPS --checkpoint_freq $FREQ --num_threads 1 --skip_model_save > $d.log 2>&1 || echo FAILED $d"
    done
  done
  # K reference runs (ERM and ReweightedERM, logits saved), via train_k_reference.py's layout
  kd="$OUT/kref/$name"
  echo "python scripts/train_k_reference.py --dataset $ds --data_dir $DATA --output_dir $kd --test_envs $env --trial_seeds 0 --data_seed $dseed --hparams '$hp' --steps $STEPS --checkpoint_freq $FREQ -- --num_threads 1 > $kd.log 2>&1 || echo FAILED $kd"
done
} | xargs -d "\n" -P "$JOBS" -I{} bash -c "{}"
T1=$(date +%s); echo "training: $(( T1 - T0 )) s (wall)"
python -m analysis.aotl "$OUT/sweep" --table per-ood --format csv --output "$OUT/aotl_per_ood.csv" --plot "$OUT/plots"
cat "$OUT/aotl_per_ood.csv"; ls "$OUT/plots"
python -m analysis.validity report --input_dir "$OUT/sweep" --k_dir "$OUT/kref" --format csv --output "$OUT/validity.csv"
python -m analysis.validity report --input_dir "$OUT/sweep" --k_dir "$OUT/kref"
python - "$OUT/validity.csv" <<'PY'
import sys, numpy as np, pandas as pd
t = pd.read_csv(sys.argv[1]); print(t.to_string(index=False))
bad = []
for c in [c for c in t.columns[1:] if c != "Method"]:  # Method: names
    for b, v in zip(t.iloc[:, 0], t[c]):
        try:
            ok = np.isfinite(float(v))
        except (TypeError, ValueError):
            ok = str(v).strip().lower() in ("pass", "fail", "yes", "no", "true", "false")
        if not ok:
            bad.append((b, c, v))
print("non-finite cells:", bad if bad else "none")
sys.exit(1 if bad else 0)
PY
echo "total: $(( $(date +%s) - T0 )) s (wall)"
