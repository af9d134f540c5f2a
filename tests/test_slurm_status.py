"""Slurm's view in `sweep status`: parsing what scontrol and sacct print (text copied from
Slurm 22.05 on a single-node cluster), and the submissions file the launcher keeps."""
from types import SimpleNamespace

from domainbed.launch import slurm_status

# `scontrol show job -o 7` while task 0 runs and tasks 1-2 wait (abridged records)
SCONTROL = (
    "JobId=8 ArrayJobId=7 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=submitit "
    "UserId=root(0) JobState=RUNNING Reason=None Dependency=(null) Partition=debug\n"
    "JobId=7 ArrayJobId=7 ArrayTaskId=1-2%2 ArrayTaskThrottle=2 JobName=submitit "
    "UserId=root(0) JobState=PENDING Reason=JobArrayTaskLimit Partition=debug\n"
    "JobId=12 JobName=wrap UserId=root(0) JobState=TIMEOUT Reason=TimeLimit\n")
SACCT = "7_0|COMPLETED\n7_1|CANCELLED by 0\n7_2|TIMEOUT\n"


def test_scontrol_records_give_one_state_per_array_task():
    assert slurm_status.parse_scontrol(SCONTROL) == {
        "7_0": "RUNNING", "7_1": "PENDING", "7_2": "PENDING", "12": "TIMEOUT"}


def test_sacct_states_lose_their_by_clause():
    assert slurm_status.parse_sacct(SACCT) == {
        "7_0": "COMPLETED", "7_1": "CANCELLED", "7_2": "TIMEOUT"}


def test_view_covers_unfinished_submitted_jobs_only(tmp_path, monkeypatch):
    jobs = [SimpleNamespace(output_dir=str(tmp_path / name), state=state)
            for name, state in (("a", "done"), ("b", "interrupted"), ("c", "not launched"),
                                ("d", "not launched"))]
    slurm_status.record_submissions(str(tmp_path), [(str(tmp_path / "a"), "7_0"),
                                                    (str(tmp_path / "b"), "7_1"),
                                                    (str(tmp_path / "c"), "7_2")])
    slurm_status.record_submissions(str(tmp_path), [(str(tmp_path / "b"), "9_0")])
    asked = []

    def fake_states(ids):
        asked.append(sorted(ids))
        return {"9_0": "TIMEOUT"}
    monkeypatch.setattr(slurm_status, "slurm_states", fake_states)
    view = slurm_status.slurm_view(jobs, str(tmp_path))
    assert asked == [["7_2", "9_0"]]   # the latest submission of b; a is done, d never sent
    assert view == {str(tmp_path / "b"): "TIMEOUT", str(tmp_path / "c"): "unknown to Slurm"}
    assert slurm_status.summarize_view(view) == (
        "Slurm's view of the jobs not finished here: 1 timeout, 1 unknown to Slurm.")


def test_no_submissions_no_view(tmp_path):
    jobs = [SimpleNamespace(output_dir=str(tmp_path / "a"), state="failed")]
    assert slurm_status.slurm_view(jobs, str(tmp_path)) == {}
