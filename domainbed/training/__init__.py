"""One training run: the step loop (`loop`), minibatches (`batches`), evaluation and the
evaluated splits (`evaluation`, `splits`), resume state (`resume`) and precision
(`precision`). Every piece takes a `domainbed.RunConfig`."""
