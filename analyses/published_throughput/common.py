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
