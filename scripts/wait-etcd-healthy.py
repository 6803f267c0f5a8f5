"""Waits until every etcd member named on the command line reports itself
healthy (GET /health), for at most the seconds given first; exits non-zero
naming the member that did not. Usage: wait-etcd-healthy.py SECONDS ADDR..."""
import json
import sys
import time
import urllib.request

deadline = time.time() + float(sys.argv[1])
for address in sys.argv[2:]:
    while True:
        try:
            with urllib.request.urlopen(f"http://{address}/health", timeout=1) as reply:
                if json.load(reply).get("health") == "true":
                    break
        except Exception:
            pass
        if time.time() > deadline:
            sys.exit(f"etcd at {address} not healthy within {sys.argv[1]} s")
        time.sleep(0.2)
