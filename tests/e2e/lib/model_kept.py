"""The model survives a killed syncer (docs/deployments.md "The syncer dying"): for the kill tests.

check(events, tol) takes the syncer's metrics.jsonl events, which hold every syncer process of
the run, each from its `start`. For every syncer that replaced a dead one it checks that Θ was
recovered, not re-initialised (syncer_recovered: at most `lost` merges of those made before
the kill missing), and that its first global evaluation of Θ is within `tol` (a fraction) of
the last one before the kill: the model was kept, not only the job. Returns one line per
restart for the test's output; raises AssertionError otherwise.
"""


def check(events, tol=0.10, lost=8):
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    lines = []
    for a, b in zip(starts, starts[1:] + [len(events)]):
        part = events[a:b]
        if not any(e["event"] == "resume" and e.get("recovering") for e in part):
            continue
        rec = [e for e in part if e["event"] == "syncer_recovered"]
        assert rec, "a restarted syncer did not recover Θ (no syncer_recovered event)"
        r = rec[0]
        assert not r["theta_reinitialised"], r
        assert r["merges_before"] - r["merges_recovered"] <= lost, r
        before = [e for e in events[:a] if e["event"] == "global_eval"]
        after = [e for e in part if e["event"] == "global_eval"]
        assert before and after, "no global evaluation on one side of the kill"
        last, first = before[-1]["val_loss"], after[0]["val_loss"]
        assert first <= last * (1 + tol), (f"Θ was not kept across the syncer's death: val_loss {last:.4f} "
                                            f"before, {first:.4f} after (tolerance {tol:.0%})")
        lines.append(f"restarted syncer: recovered {r['merges_recovered']} of {r['merges_before']} merges "
                     f"from units {r['from_units']} in {r['recover_s']:.2f}s; val_loss {last:.4f} before "
                     f"the kill, {first:.4f} after")
    return lines
