import sys, glob, importlib.util, csv, os
sys.path.insert(0, os.path.dirname(__file__))
import common
for f in sorted(glob.glob(os.path.join(os.path.dirname(__file__), "src", "s*.py"))):
    n0 = len(common.ROWS)
    spec = importlib.util.spec_from_file_location(os.path.basename(f)[:-3], f)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    print(os.path.basename(f), len(common.ROWS)-n0)
FULL = {"@8e3d65dcfe":"@8e3d65dcfe3504689bfc5b6e67d502780aacad41","@7575f2c91":"@7575f2c9137cf6ea24f7cb63ae22c1bad38bbe79","@24bdadb":"@24bdadb228e2d55bc0c69deec034b86a73da6917",
 "@fc78b55":"@fc78b55b65446fbade0306ac2e619a6182bfea47","@8f5cbb3":"@8f5cbb3799ea8cc031ed2c2cee1cbdbc15b240ad","@35a9aec":"@35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae","@58c5b188":"@58c5b188c221feb1a58141eedba247919859aeca"}
for row in common.ROWS:
    for k, v in FULL.items():
        if row["source"].endswith(k): row["source"] = row["source"][:-len(k)] + v
with open(os.path.join(os.path.dirname(__file__), "published.csv"), "w", newline="") as fh:
    w = csv.DictWriter(fh, fieldnames=common.COLS); w.writeheader(); w.writerows(common.ROWS)
print("total", len(common.ROWS))
