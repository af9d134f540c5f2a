"""A job's log shows where it is: one line per checkpoint (step, epoch, losses, accuracies)."""
from domainbed.training.loop import checkpoint_line


def test_checkpoint_line_has_step_epoch_values_and_accuracies():
    results = {"step": 40, "epoch": 0.6412, "loss": 0.51234, "step_time": 0.02,
               "env0_in_acc": 0.8, "env0_out_acc": 0.75, "env1_out_acc": 0.1,
               "env0_in_wga": 0.5, "args": {}, "hparams": {}, "mem_gb": 0.0}
    line = checkpoint_line(results)
    assert line.startswith("step 40  epoch 0.64  loss 0.5123  step_time 0.0200")
    assert "env0_in_acc 0.8000  env0_out_acc 0.7500  env1_out_acc 0.1000" in line
    assert "\n" not in line and "args" not in line and "wga" not in line
