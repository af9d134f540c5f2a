"""Slurm's view of a sweep's jobs, for `sweep status`.

The slurm launcher returns as soon as the array is submitted; a job's run directory
then says nothing until the job starts (pending), and nothing about why it stopped
(cancelled, timed out, node failure). So the launcher appends one line per job to
``<sweep_dir>/.slurm_jobs.jsonl`` (run directory name, Slurm job id "ARRAY_TASK"), and
`status` asks Slurm about the jobs whose run directory is not finished: `scontrol show
job` for the jobs in the queue and those that left it recently (slurm.conf's MinJobAge),
and `sacct`, where accounting is configured, for older ones.
"""
import json
import os
import re
import subprocess
from typing import Any

from oodutils.log import get_logger
from oodutils.pinned_dir import PinnedDir
from oodutils.untrusted import parse_json, read_lines

LOG = get_logger(__name__)
SUBMISSIONS_FILE = ".slurm_jobs.jsonl"
QUERY_TIMEOUT_S = 30


def record_submissions(sweep_dir: str, submissions: Any) -> None:
    """Append (output_dir, job_id) pairs to the sweep's submissions file; a later
    submission of the same run directory supersedes an earlier one."""
    lines = "".join(json.dumps({"run": os.path.basename(os.path.normpath(out)),
                                "job_id": str(job_id)}) + "\n"
                    for out, job_id in submissions)
    with PinnedDir.open(sweep_dir) as folder:   # a symlink or FIFO there: UnsafePath
        fd = folder.open_file(SUBMISSIONS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with os.fdopen(fd, "a") as f:
        f.write(lines)


def submitted_job_ids(sweep_dir: str) -> Any:
    """run directory name -> the Slurm job id of its latest submission. The file is in
    a shared sweep folder: a symlink, FIFO or folder there counts as no submissions (no
    hang), an over-long or malformed line is skipped."""
    path = os.path.join(sweep_dir, SUBMISSIONS_FILE)
    ids = {}
    try:
        for line in read_lines(path, 1 << 16):
            entry = parse_json(line) if line is not None else None
            try:
                ids[str(entry["run"])] = str(entry["job_id"])  # type: ignore[index]
            except (KeyError, TypeError):
                continue   # a torn last line of an interrupted submission
    except OSError:
        return {}
    return ids


def _expand_tasks(array_id: Any, tasks: Any) -> Any:
    """Task ids of an ArrayTaskId field: "3", "1-4", "0,2,5-7", "1-9%2" (throttle)."""
    ids: list[Any] = []
    for part in tasks.split("%")[0].split(","):
        if "-" in part:
            low, high = part.split("-", 1)
            ids.extend(f"{array_id}_{i}" for i in range(int(low), int(high) + 1))
        elif part.isdigit():
            ids.append(f"{array_id}_{part}")
    return ids


def parse_scontrol(text: str) -> Any:
    """job id ("ARRAY_TASK" for array tasks, else the job id) -> JobState, from
    `scontrol show job -o` (one job record per line)."""
    states = {}
    for line in text.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        array_id, tasks = fields.get("ArrayJobId"), fields.get("ArrayTaskId")
        keys = _expand_tasks(array_id, tasks) if array_id and tasks else [fields.get("JobId")]
        for key in keys:
            states[key] = fields["JobState"]
    return states


def parse_sacct(text: str) -> Any:
    """job id -> State, from `sacct -n -P -X -o JobID,State` ("CANCELLED by 0" -> CANCELLED)."""
    states = {}
    for line in text.splitlines():
        if "|" in line:
            job_id, state = line.split("|", 1)
            if state.strip():
                states[job_id.strip()] = state.split()[0]
    return states


def _query(argv: list[str]) -> Any:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        LOG.debug(f"{argv[0]}: {e}")
        return ""
    if proc.returncode != 0:
        LOG.debug(f"{' '.join(argv)}: {proc.stderr.strip()}")
    return proc.stdout


def slurm_states(job_ids: Any) -> dict[Any, Any]:
    """job id -> Slurm's state (PENDING, RUNNING, COMPLETED, CANCELLED, TIMEOUT,
    FAILED, NODE_FAIL, ...) for the ids Slurm still knows."""
    wanted = set(job_ids)
    states = {}
    for array_id in sorted({j.split("_")[0] for j in wanted}):
        states.update(parse_scontrol(_query(["scontrol", "show", "job", "-o", array_id])))
    unknown = sorted(wanted - set(states))
    if unknown:
        states.update(parse_sacct(_query(["sacct", "-n", "-P", "-X", "-o", "JobID,State",
                                          "-j", ",".join(unknown)])))
    return {j: states[j] for j in wanted if j in states}


def slurm_view(jobs: Any, sweep_dir: str, finished: Any = ("done",)) -> dict[Any, Any]:
    """run directory -> Slurm's state, for the jobs whose run directory is not finished
    and which the slurm launcher submitted; "unknown to Slurm" where Slurm has forgotten
    the job. Empty when the sweep never went through Slurm."""
    submitted = submitted_job_ids(sweep_dir)
    ours = {j.output_dir: submitted[os.path.basename(os.path.normpath(j.output_dir))]
            for j in jobs if j.state not in finished
            and os.path.basename(os.path.normpath(j.output_dir)) in submitted}
    if not ours:
        return {}
    states = slurm_states(ours.values())
    return {out: states.get(job_id, "unknown to Slurm") for out, job_id in ours.items()}


def summarize_view(view: Any) -> Any:
    """One line: how many unfinished jobs Slurm holds in each state."""
    counts: dict[Any, Any] = {}
    for state in view.values():
        word = state.lower() if state.isupper() else state   # TIMEOUT -> timeout
        counts[word] = counts.get(word, 0) + 1
    return ("Slurm's view of the jobs not finished here: "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ".")
