import subprocess
from pathlib import Path

# Repository snapshots brought onto this machine by the search tool's fetch (owner+name/repo).
MIRRORS = Path("/work/.mirror")


def git_show(repo: str, commit: str, path: str) -> str:
    """A file of a fetched repository snapshot at a commit; fails with the reason rather than reading nothing."""
    where = MIRRORS / repo.replace("/", "+") / "repo"
    done = subprocess.run(["git", "-C", str(where), "show", f"{commit}:{path}"], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{repo}@{commit}:{path} could not be read from {where} (fetch github:{repo} first): "
                         f"{done.stderr.strip()}")
    return done.stdout


COLS = ["source","quote","model","gpu","n_gpus","method","gc","sharding","offload","precision",
        "batch_per_device","grad_accum","seq_len","packing","lora_rank","lora_targets","attention",
        "framework","measured","unit","what_counted","notes"]
ROWS = []
def R(**kw):
    d = {c: "unstated" for c in COLS}
    for k in ("quote","notes","lora_rank","lora_targets"):
        d[k] = ""
    for k, v in kw.items():
        assert k in COLS, k
        d[k] = str(v)
    if d["method"] == "full":
        d["lora_rank"] = d["lora_rank"] or "n/a"; d["lora_targets"] = d["lora_targets"] or "n/a"
    else:
        d["lora_rank"] = d["lora_rank"] or "unstated"; d["lora_targets"] = d["lora_targets"] or "unstated"
    for c in ("source","model","gpu","n_gpus","method","measured","unit","what_counted"):
        assert d[c] and d[c] != "", (c, kw)
    float(d["measured"])
    ROWS.append(d)
