"""One training run: its options (`config`: `RunConfig`), the run from options to records
(`run`), the step loop (`loop`), minibatches (`batches`), evaluation and the evaluated
splits (`evaluation`, `splits`), resume state (`resume`), precision (`precision`), the
frozen-feature cache of linear probes (`feature_cache`) and a run over several processes
(`distributed`, `data_parallel`). Every piece takes a `domainbed.RunConfig`."""
