#!/bin/bash
# Open MPI's launch agent (--mca plm_rsh_agent) for "nodes" that are network namespaces
# (tests/e2e/lib/hosts.sh): where mpirun would run `ssh HOST COMMAND...`, this runs COMMAND
# inside the namespace that holds HOST's address. Same machine, same filesystem and user: the
# orted it starts reaches mpirun, and its ranks reach the other node's, over the veth links only.
set -euo pipefail
host=$1
shift
# Only this test's namespaces (hosts.sh exports the prefix): other tests use the same addresses.
for ns in $(ip netns list | awk -v p="${HOSTS_PREFIX:?netns_rsh: HOSTS_PREFIX unset (source hosts.sh)}-" 'index($1, p) == 1 {print $1}'); do
  if ip -n "$ns" -o -4 addr show 2>/dev/null | grep -q " inet $host/"; then
    exec ip netns exec "$ns" /bin/sh -c "$*"
  fi
done
echo "netns_rsh: no network namespace has the address $host" >&2
exit 255
