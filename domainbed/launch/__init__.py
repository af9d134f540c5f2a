"""Where and how jobs run: sweep planning (`sweep`), the launchers (`launchers`: dummy,
local, multi-GPU, Slurm, Ray; `pooled`; `fused` with `fused_group` and
`fused_training`), the model-zoo planner (`zoo`) and the progress display (`progress`)."""
