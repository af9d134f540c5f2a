"""Where a fused member parts from its single run: trains M members of a ColoredMNIST ERM
MLP alone (each with its own random generators) and as one fused group, in lockstep, and
reports the first step and tensor that differ (batch indices, update() values, gradients,
Adam moments, parameters, in that order within a step), by how much, and how far the
checkpoints' accuracies are apart at the end. Also: member 0 trained alone, in the
group, and in the group in reverse order (its records must not depend on the others).

    python scripts/fused_parity_probe.py [--arithmetic batched|exact] [--steps 600] \\
        [--members 3] [--width 128] [--depth 3] [--dropout 0.0] [--threads 1] [--record]

--record writes the figure to docs/benchmarks (the Benchmarks page).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
LRS = (1e-3, 3e-3, 2e-4, 5e-4)


def build_run(root, tag, i, args, data):
    from domainbed.training.config import RunConfig
    from domainbed.training.loop import TrainingRun, build_run_data
    hparams = {"arch": "mlp", "mlp_width": args.width, "mlp_depth": args.depth,
               "mlp_dropout": args.dropout, "batch_size": 64, "lr": LRS[i % len(LRS)]}
    config = RunConfig.from_argv([
        "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", root,
        "--output_dir", os.path.join(root, f"{tag}{i}"), "--test_envs", "2",
        "--steps", str(args.steps), "--checkpoint_freq", str(args.checkpoint_freq),
        "--seed", str(i), "--num_threads", str(args.threads), "--hparams",
        json.dumps(hparams)])
    algorithm_cls, dataset_cls = config.validate()
    resolved = config.resolve_hparams(notify=lambda message: None)
    data = data or build_run_data(dataset_cls, config, resolved)
    return TrainingRun(config, resolved, algorithm_cls, dataset_cls, log=lambda m: None,
                       data=data), data


def build_runs(root, tag, args, order, data=None):
    """TrainingRuns of members `order`, each with its own RandomStates (as built)."""
    from domainbed.training.random_states import RandomStates
    runs, states = [], []
    for i in order:
        run, data = build_run(root, tag, i, args, data)
        runs.append(run)
        states.append(RandomStates.capture())
    return runs, states, data


def first_difference(step, single, fused, member, grads, values):
    """(step, tensor, max |difference|, max |value|) of the first tensor that differs."""
    import torch
    checks = [("update() loss", torch.tensor(single.last_values["loss"]),
               torch.tensor(values[member]["loss"]))]
    for name, p in single.algorithm.network.named_parameters():
        checks.append((f"gradient of {name}", p.grad, grads[name][member]))
    optimizer = single.algorithm.optimizer
    for key in ("exp_avg", "exp_avg_sq"):
        for name, p in single.algorithm.network.named_parameters():
            checks.append((f"Adam {key} of {name}", optimizer.state[p][key],
                           fused.exp_avg[name][member] if key == "exp_avg" else
                           fused.exp_avg_sq[name][member]))
    for name, p in single.algorithm.network.named_parameters():
        checks.append((f"parameter {name}", p.detach(), fused.params[name][member]))
    for what, a, b in checks:
        if not torch.equal(a, b):
            return step, what, (a - b).abs().max().item(), a.abs().max().item()
    return None


def layer_diagnosis(single, fused, member, step):
    """Each Linear layer of the network on the step's input: the single run's kernel
    (F.linear: addmm, bias inside the product) against the batched one (vmap)."""
    import torch
    import torch.nn.functional as F
    from torch.func import vmap
    x = torch.cat([x for x, _ in single.minibatches.batches(step)]).flatten(1)
    lines = []
    for name, module in single.algorithm.network.named_modules():
        if isinstance(module, torch.nn.Linear) and module.in_features == x.shape[1]:
            alone = F.linear(x, module.weight, module.bias)
            stacked = vmap(F.linear)(x.expand(len(fused.members), *x.shape),
                                     fused.params[f"{name}.weight"],
                                     fused.params[f"{name}.bias"])[member]
            lines.append(f"  layer {name} at step {step}: single addmm vs batched: max |diff| "
                         f"{(alone - stacked).abs().max().item():.3g} "
                         f"(values up to {alone.abs().max().item():.3g})")
            x = F.relu(alone).detach()
    return lines


def comparable(records):
    """Records without what differs between any two runs (seconds, output folder)."""
    out = []
    for line in records:
        record = json.loads(line)
        record.pop("step_time", None)
        record["args"].pop("output_dir", None)
        out.append(record)
    return out


def accuracy_gap(single_records, fused_records):
    """Largest |difference| of any env*_acc between two lists of records, in points."""
    gap = 0.0
    for a, b in zip(single_records, fused_records):
        a, b = json.loads(a), json.loads(b)
        gap = max([gap] + [abs(a[k] - b[k]) * 100 for k in a
                           if k.startswith("env") and k.endswith("_acc")])
    return gap


def lockstep(root, args):
    """Single runs and one fused group, step by step; prints the first parting."""
    from domainbed.launch.fused_training import FusedGroup, train_group
    order = list(range(args.members))
    singles, single_states, data = build_runs(root, "single", args, order)
    if args.arithmetic == "exact":
        fused_runs, fused_states, _ = build_runs(root, "fused", args, order, data)
        train_group(fused_runs, 0, lambda *a: None, lambda run, e: print(e), "exact",
                    fused_states)
        for i in order:
            with single_states[i].active():
                for step in range(args.steps):
                    singles[i].train_step(step)
                    if singles[i].is_checkpoint(step):
                        singles[i].checkpoint(step)
        same = [comparable(singles[i].records) == comparable(fused_runs[i].records)
                for i in order]
        print(f"exact: records identical to the single runs' for {sum(same)} of "
              f"{len(same)} members")
        return {"first": None, "layer": "", "gap": max(accuracy_gap(singles[i].records,
                                                       fused_runs[i].records) for i in order)}
    fused_runs, fused_states, _ = build_runs(root, "fused", args, order, data)
    group = FusedGroup(fused_runs)
    captured, adam = {}, group._adam

    def capture(grads):
        captured.update({k: v.clone() for k, v in grads.items()})
        adam(grads)
    group._adam = capture
    first, drift = [None] * len(order), {}
    for step in range(args.steps):
        if step == 0:
            diagnosis = layer_diagnosis(singles[0], group, 0, 0)
        for i in order:
            with single_states[i].active():
                singles[i].last_values = singles[i].train_step(step)
        values = group.train_step(step)
        for i in order:
            fused_runs[i].accumulate(step, values[i], 0.0)
            first[i] = first[i] or first_difference(step, singles[i], group, i, captured,
                                                    values)
        if fused_runs[0].is_checkpoint(step):
            group.write_back()
            logits = group.predict()
            for i in order:
                with fused_states[i].active():
                    fused_runs[i].checkpoint(step, {k: v[i] for k, v in logits.items()})
                with single_states[i].active():
                    singles[i].checkpoint(step)
            drift[step] = max((p.detach() - group.params[n][i]).abs().max().item()
                              for i in order
                              for n, p in singles[i].algorithm.network.named_parameters())
    for i, f in enumerate(first):
        print(f"member {i}: " + ("never parts" if f is None else
                                 f"first parts at step {f[0]}: {f[1]}, max |diff| {f[2]:.3g} "
                                 f"(values up to {f[3]:.3g})"))
    print("\n".join(diagnosis))
    for step, d in sorted(drift.items()):
        print(f"  step {step}: largest parameter difference {d:.3g}")
    gaps = [accuracy_gap(singles[i].records, fused_runs[i].records) for i in order]
    print(f"largest accuracy difference over all checkpoints: {max(gaps):.2f} points "
          f"(per member: {', '.join(f'{g:.2f}' for g in gaps)})")
    return {"first": first[0], "gap": max(gaps), "layer": diagnosis[0].strip()}


def composition(root, args):
    """Member 0 alone, in the group, in the group reversed: are its records the same?"""
    from domainbed.launch.fused_training import train_group
    records, data = {}, None
    layouts = {"alone": [0], "group": list(range(args.members)),
               "reversed": list(reversed(range(args.members)))}
    for tag, order in layouts.items():
        runs, states, data = build_runs(root, f"{tag}_", args, order, data)
        train_group(runs, 0, lambda *a: None, lambda run, e: print(e), args.arithmetic,
                    states)
        records[tag] = comparable(runs[order.index(0)].records)
    same = all(r == records["alone"] for r in records.values())
    print(f"{args.arithmetic}: member 0's records alone / in a group of {args.members} / "
          f"reversed: {'identical' if same else 'DIFFERENT'}")
    return same


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arithmetic", default="batched", choices=["batched", "exact"])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--checkpoint_freq", type=int, default=100)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as root:
        result = lockstep(root, args)
        same = composition(root, args)
    if args.record:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from benchfigures import record
        first = result["first"]
        parting = ("never parts from its single run" if first is None else
                   f"parts at step {first[0]} ({first[1]}, max |diff| {first[2]:.2g})")
        record(f"fused-parity-{args.arithmetic}-dropout{args.dropout:g}".replace(".", "p"),
               what=f"Fused ({args.arithmetic}) member, dropout {args.dropout:g}",
               headline=f"largest accuracy difference {result['gap']:.2f} points",
               peer="its single run",
               command=" ".join(["python scripts/fused_parity_probe.py"] + sys.argv[1:]
                                ).replace(" --record", ""),
               result=f"member {parting}; {result['layer'] or 'no layer differs'}; "
                      f"largest accuracy difference "
                      f"{result['gap']:.2f} points; records "
                      f"{'independent of' if same else 'DEPEND on'} the group's composition",
               method=f"ColoredMNIST ERM MLP {args.width}x{args.depth}, {args.members} "
                      f"members, {args.steps} steps, CPU; "
                      "lockstep comparison of every tensor each step; checkpoints every "
                      f"{args.checkpoint_freq} steps; {args.threads} thread(s)")


if __name__ == "__main__":
    main()
