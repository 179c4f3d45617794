"""bench/gpu/lab12_twice.py SUMMARY: do two lab12 runs (results/lab12.json and
results/lab12_again.json) give bit-identical losses, layout by layout? Appends one line to SUMMARY."""
import json, sys
a = json.load(open("results/lab12.json"))["facts"]["smoke"]["runs"]
b = json.load(open("results/lab12_again.json"))["facts"]["smoke"]["runs"]
same = [k for k in a if k in b and a[k]["loss"] == b[k]["loss"]]
diff = {k: max(abs(x - y) / abs(y) for x, y in zip(a[k]["loss"], b[k]["loss"]))
        for k in a if k in b and k not in same}
line = "lab12 --device cuda twice: bit-identical losses in %d of %d runs (%s); differing: %s" % (
    len(same), len(a), ", ".join(same) or "none",
    ", ".join("%s %.1e" % kv for kv in sorted(diff.items())) or "none")
print(line); open(sys.argv[1], "a").write(line + "\n")
