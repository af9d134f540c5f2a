"""Sweep progress: counts, ETA from finished jobs' durations, status lines off a terminal."""
import functools
import io
from types import SimpleNamespace

from domainbed.launch.progress import SweepProgress, format_duration


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_status_lines_per_finished_job_and_every_interval():
    clock, lines = FakeClock(), []
    progress = SweepProgress(4, slots=2, echo=lines.append, interval=30, stream=io.StringIO(),
                             clock=clock)
    progress.job_started()
    progress.job_started()
    assert lines == [] and progress.eta() is None
    clock.now = 31
    progress.tick()
    assert lines[-1] == ("[sweep] 0/4 done, 0 failed, 2 running, 2 waiting; elapsed 0m31s, "
                         "ETA unknown")
    clock.now = 40
    progress.job_finished(SimpleNamespace(status="ok"), 40.0)
    progress.job_finished(SimpleNamespace(status="failed"), 20.0)
    # mean 30 s per job, 2 jobs left, 2 at a time: 30 s
    assert lines[-1] == ("[sweep] 1/4 done, 1 failed, 0 running, 2 waiting; elapsed 0m40s, "
                         "ETA 0m30s")
    progress.tick()  # under the interval since the last line: nothing new
    assert len(lines) == 3
    progress.job_started()
    progress.job_finished(SimpleNamespace(status="skipped_done"), 0.0)
    assert progress.durations == [40.0, 20.0] and progress.done == 2


def test_no_bar_without_a_terminal_and_durations_format():
    progress = SweepProgress(1, echo=print, stream=io.StringIO())
    assert progress.bar is None
    assert format_duration(3725) == "1h02m05s" and format_duration(59.6) == "1m00s"


def test_local_launcher_reports_progress(tmp_path, capsys):
    import sys

    from domainbed.launch.jobs import Command
    from domainbed.launch.local import local_launcher
    commands = []
    for name in ("a", "b"):
        out = tmp_path / name
        script = f"open({str(out / 'done')!r}, 'w').write('done')"
        commands.append(Command([sys.executable, "-c", script], str(out)))
    outcomes = local_launcher(commands, max_workers=2)
    assert [o.status for o in outcomes] == ["ok", "ok"]
    out = capsys.readouterr().out
    assert "[sweep] 2/2 done, 0 failed, 0 running, 0 waiting" in out


def _writer_commands(tmp_path, names):
    """Commands that finish a job by writing its `done` file, each labelled."""
    import sys

    from domainbed.launch.jobs import Command
    commands = []
    for name in names:
        out = tmp_path / name
        script = f"open({str(out / 'done')!r}, 'w').write('done')"
        commands.append(Command([sys.executable, "-c", script], str(out),
                                label=f"ERM on Debug28, test envs [{name}]"))
    return commands


def test_pooled_launcher_shows_the_sweep_progress_and_names_each_job(tmp_path):
    from domainbed.launch.pooled import pooled_launcher
    lines = []
    outcomes = pooled_launcher(_writer_commands(tmp_path, ["0", "1", "2"]), max_workers=2,
                               echo=lines.append)
    assert sorted(o.status for o in outcomes) == ["ok"] * 3
    assert lines[-1].startswith("[sweep] 3/3 done, 0 failed, 0 running, 0 waiting")
    done = sorted(line for line in lines if line.startswith("Done: "))
    assert done == [f"Done: ERM on Debug28, test envs [{i}] ({tmp_path / str(i)})"
                    for i in range(3)]


def test_local_launcher_status_lines_name_the_job(tmp_path, capsys):
    from domainbed.launch.local import local_launcher
    local_launcher(_writer_commands(tmp_path, ["7"]))
    out = capsys.readouterr().out
    assert f"Done: ERM on Debug28, test envs [7] ({tmp_path / '7'})" in out


def test_with_two_workers_the_line_counts_the_jobs_really_running(tmp_path):
    """The line printed as a job ends counts the job its worker took next (issue 43,
    item 6): 3 jobs, 2 workers: the first line says 2 running, not 1."""
    from domainbed.launch.local import local_launcher
    from domainbed.launch.pooled import pooled_launcher
    for name, launcher in (("pooled", pooled_launcher), ("local", local_launcher)):
        lines = []
        launcher(_writer_commands(tmp_path / name, ["0", "1", "2"]), max_workers=2,
                 echo=lines.append)
        status = [line for line in lines if line.startswith("[sweep]")]
        assert status[0].startswith("[sweep] 1/3 done, 0 failed, 2 running, 0 waiting"), \
            (name, status)
        assert status[-1].startswith("[sweep] 3/3 done, 0 failed, 0 running"), (name, status)


def _on_a_pty_without_a_size(monkeypatch, run):
    """What `run()` writes on stderr when stderr is a pseudo-terminal that reports no
    window size (0 columns: `script`, `ssh -t`, a CI runner)."""
    import os
    import select
    import sys
    master, slave = os.openpty()
    stream = os.fdopen(slave, "w", buffering=1)
    monkeypatch.setattr(sys, "stderr", stream)
    chunks = []

    def drain():
        while select.select([master], [], [], 0)[0]:
            chunks.append(os.read(master, 65536))
    try:
        run()
        stream.flush()
        drain()
    finally:
        stream.close()
        os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_both_launchers_show_the_one_bar_on_a_terminal(tmp_path, monkeypatch):
    """The pooled launcher shows the local launcher's bar (jobs done, failed, running,
    elapsed, ETA), one implementation, even where the terminal gives no width (issue 43,
    item 7)."""
    from domainbed.launch.local import local_launcher
    from domainbed.launch.pooled import pooled_launcher
    for name, launcher in (("pooled", pooled_launcher), ("local", local_launcher)):
        commands = _writer_commands(tmp_path / name, ["0", "1"])
        shown = _on_a_pty_without_a_size(monkeypatch, functools.partial(
            launcher, commands, max_workers=2, echo=lambda line: None))
        final = shown.replace("\r", "\n").splitlines()
        bars = [line for line in final if line.startswith("sweep: 100%")]
        assert bars, (name, shown[-800:])
        assert "2/2 [" in bars[-1] and "failed 0, running 0, ETA 0m00s" in bars[-1], bars[-1]
