# A unit of two "nodes" in one data centre (docs/deployments.md "Several hosts"): unit 1's two ranks run in
# two network namespaces, launched by one mpirun whose launch agent enters the other
# namespace (tests/e2e/lib/netns_rsh.sh as --mca plm_rsh_agent), with the syncer and unit 0
# in namespaces of their own (tests/e2e/lib/hosts.sh). Checked:
#   - the decoupled job completes its token budget; both units are merged;
#   - the unit's gradient all-reduce crossed the veth between its nodes: the second node's
#     link carried at least half the gradient's bytes per inner step each way (the least a
#     2-rank all-reduce sends), so no shared memory stood in for the network;
#   - every process the test started has ended.
# Skipped (77) where network namespaces cannot be made (not root, no CAP_NET_ADMIN).
source "$(dirname "$0")/lib/common.sh"
source "$(dirname "$0")/lib/text_data.sh"
source "$(dirname "$0")/lib/hosts.sh"
cd "$WORK"
hosts_add syncer 1
hosts_add unit0 10
hosts_add node1a 20
hosts_add node1b 21
hosts_env
make_text_shards text
cat > c.yaml <<YAML
mode: decoupled
run: {dir: run, log_every: 10, progress: false, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 64, seq_len: 64}
data: {train: text/train_*.bin, val: text/val_*.bin}
train: {batch_size: 8, steps: 60, warmup_steps: 5}
eval: {val_tokens: 512, sample_tokens: 0}
units: {count: 2, ranks: [1, 2]}
outer: {fragments: 2, h: 4, overlap: 1}
syncer: {quorum: 1, eval_every: 50, connect_wait_s: 60, listen: "$(host_ip syncer):0"}
YAML
start_on syncer "$DDILOCO" syncer --config c.yaml > syncer.log 2>&1
syncer=$!
start_on unit0 "${DDILOCO_MPIRUN[@]}" -np 1 "$DDILOCO" unit --config c.yaml --unit 0 > unit0.log 2>&1
job0=$!
# One mpirun for both nodes, in the first one's namespace; the agent starts the second node's
# orted in its namespace, and both reach each other (and mpirun) over the veths only.
start_on node1a "${DDILOCO_MPIRUN[@]}" -np 2 -H "$(host_ip node1a),$(host_ip node1b)" \
  --mca plm_rsh_agent "$SRC/tests/e2e/lib/netns_rsh.sh" "$DDILOCO" unit --config c.yaml --unit 1 > unit1.log 2>&1
job1=$!
for job in $job1 $job0 $syncer; do
  rc=0; wait_within 240 $job || rc=$?
  ((rc == 0)) || { tail -20 syncer.log unit0.log unit1.log; fail "a job exited $rc"; }
done
tx=$(ip -n "$(ns_of node1b)" -s -j link show eth0 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])')
rx=$(ip -n "$(ns_of node1b)" -s -j link show eth0 | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
/usr/bin/python3 - "$tx" "$rx" <<'PY' || fail "the two-node unit's record is wrong"
import json, sys
tx, rx = int(sys.argv[1]), int(sys.argv[2])
ev = [json.loads(l) for l in open("run/metrics.jsonl")]
start = next(e for e in ev if e["event"] == "start")
done = next(e for e in ev if e["event"] == "done")
assert not done["interrupted"] and done["tokens"] >= start["token_budget"], done
merges = [e for e in ev if e["event"] == "merge"]
assert any(1 in m["units"] for m in merges) and any(0 in m["units"] for m in merges), "a unit was never merged"
conn = next(e for e in ev if e["event"] == "unit_connected" and e["unit"] == 1)
assert conn["ranks"] == 2 and len(conn["processes"]) == 2, conn
steps = max(json.loads(l)["step"] for l in open("run/unit_1.jsonl") if '"event":"train"' in l)
need = steps * start["parameters"] * 4 // 2  # fp32 gradient, half of it each way per step
assert tx >= need and rx >= need, f"node 1b's link carried {tx} B out, {rx} B in; a 2-rank all-reduce of {steps} steps sends at least {need} B"
print(f"two-node unit: {steps} steps; node 1b's veth carried {tx / 1e6:.1f} MB out, {rx / 1e6:.1f} MB in "
      f"(all-reduce floor {need / 1e6:.1f} MB each way); final val_loss {done['val_loss']:.3f}")
PY
echo "netns_two_node_unit: passed"
