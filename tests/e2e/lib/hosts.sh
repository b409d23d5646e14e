# Hosts on one machine: one network namespace per "host" (the syncer's data centre, each
# unit's, each node of a unit), all joined through a switch namespace that holds a bridge.
# Addresses exist only on the test's veth pairs, in 169.254.100.0/24 (link-local: never
# routed); no namespace has a link to the host's own network. Everything is deleted when the
# test ends, on failure too, and every process still inside a namespace is killed first.
#
#   source lib/hosts.sh            (after common.sh; exits 77 where namespaces cannot be made)
#   hosts_add syncer 1             namespace "<prefix>-syncer", 169.254.100.1, link "<prefix>-syncer"
#   on syncer CMD...               run CMD inside the namespace; start_on: in the background
#   wait_within SECONDS PID        wait for a background job; kill it past SECONDS (status 124)
#   link_down syncer / link_up     cut / restore that host's link (both ends: the kernel drops
#                                  every packet; the processes on either side keep running)
#   link_shape syncer RATE [BURST] tbf on both directions of the link (e.g. 700kbit); link_unshape
#   link_bytes syncer              bytes the link carried so far (both directions)
#   host_ip syncer                 169.254.100.1
#
# Topology: every host has one veth into the switch, so cutting a unit's link partitions that
# unit only, and cutting the syncer's partitions the syncer from every unit at once. Two nodes
# of one unit reach each other over the same switch.
export HOSTS_PREFIX="dd$$"  # unique per test process: ctest -j runs several of these at once
declare -F fail > /dev/null || fail() { echo "FAIL: $*" >&2; exit 1; }  # (scripts/wan_kernel.sh)
HOSTS_NET=169.254.100
HOSTS=()
declare -A HOST_IP HOST_OUTER

hosts_skip() { echo "SKIP: $*" >&2; exit 77; }

hosts_cleanup() {
  local ns p
  for ns in "${HOSTS[@]/#/$HOSTS_PREFIX-}" "$HOSTS_PREFIX-switch"; do
    ip netns list 2>/dev/null | grep -qw "^$ns" || continue
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
}

# Chain our cleanup before the caller's trap (common.sh's stops the test's jobs, removes $WORK).
hosts_trap=$(trap -p EXIT)
hosts_trap=${hosts_trap#trap -- \'}
hosts_trap=${hosts_trap%\' EXIT}
eval "trap -- 'hosts_cleanup; $hosts_trap' EXIT"

# Can this process make namespaces? (root with CAP_NET_ADMIN and CAP_SYS_ADMIN; a container
# may refuse either.)
command -v ip > /dev/null || hosts_skip "no 'ip' command (iproute2) to make network namespaces"
if ! out=$(ip netns add "$HOSTS_PREFIX-switch" 2>&1); then
  hosts_skip "cannot make a network namespace (needs root with CAP_NET_ADMIN): $out"
fi
if ! out=$(ip -n "$HOSTS_PREFIX-switch" link add sw type bridge 2>&1); then
  hosts_skip "cannot make a bridge inside a network namespace: $out"
fi
if ! out=$(ip netns exec "$HOSTS_PREFIX-switch" true 2>&1); then
  hosts_skip "cannot run a command inside a network namespace (ip netns exec): $out"
fi
ip -n "$HOSTS_PREFIX-switch" link set lo up
ip -n "$HOSTS_PREFIX-switch" link set sw up

ns_of() { echo "$HOSTS_PREFIX-$1"; }
host_ip() { echo "${HOST_IP[$1]}"; }

# hosts_add NAME N: host NAME with address 169.254.100.N on its veth (named NAME inside it).
hosts_add() {
  local name=$1 n=$2 ns="$HOSTS_PREFIX-$1"
  local outer; outer=$(printf 'v%x_%d' $$ "$n")  # the switch's end (IFNAMSIZ: 15 characters)
  ip netns add "$ns"
  HOSTS+=("$name")
  HOST_IP[$name]="$HOSTS_NET.$n"
  ip -n "$ns" link set lo up
  ip link add "$outer" type veth peer name eth0 netns "$ns"
  ip link set "$outer" netns "$HOSTS_PREFIX-switch"
  ip -n "$HOSTS_PREFIX-switch" link set "$outer" master sw up
  ip -n "$ns" addr add "$HOSTS_NET.$n/24" dev eth0
  ip -n "$ns" link set eth0 up
  HOST_OUTER[$name]=$outer
}

# on NAME CMD...: run CMD in host NAME's namespace (same filesystem, same user, its network
# only). start_on NAME CMD...: the same in the background, with $! the command's own pid
# (`ip netns exec` execs it; `on ... &` would give a subshell's pid instead).
on() { local ns="$HOSTS_PREFIX-$1"; shift; ip netns exec "$ns" "$@"; }
start_on() { local ns="$HOSTS_PREFIX-$1"; shift; ip netns exec "$ns" "$@" & }

# wait_within SECONDS PID: waits for a background job (sleeping, 0.2 s checks); one still
# running after SECONDS is killed (its process group too, then itself) and the status is 124,
# so that a hung run ends in the caller's own time, its EXIT trap cleaning up, not ctest's.
wait_within() {
  local limit=$1 pid=$2 waited=0
  while kill -0 "$pid" 2>/dev/null && ((waited < limit * 5)); do sleep 0.2; waited=$((waited + 1)); done
  if kill -0 "$pid" 2>/dev/null; then
    echo "hosts.sh: pid $pid still running after ${limit}s: killed" >&2
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 124
  fi
  wait "$pid"
}

link_down() {
  ip -n "$HOSTS_PREFIX-$1" link set eth0 down
  ip -n "$HOSTS_PREFIX-switch" link set "${HOST_OUTER[$1]}" down
}
link_up() {
  ip -n "$HOSTS_PREFIX-switch" link set "${HOST_OUTER[$1]}" up
  ip -n "$HOSTS_PREFIX-$1" link set eth0 up
}

# link_shape NAME RATE [BURST]: a token bucket (tbf) of RATE (tc units: 700kbit, 10mbit) and
# BURST (default 64kb, as wan.burst_kb) on both directions of NAME's link; the kernel queues
# what exceeds it (up to 1 s of it) and adds no delay. link_unshape NAME removes it.
link_shape() {
  local name=$1 rate=$2 burst=${3:-64kb} dev
  for dev in "$HOSTS_PREFIX-$name eth0" "$HOSTS_PREFIX-switch ${HOST_OUTER[$name]}"; do
    set -- $dev
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" latency 1s ||
      fail "tc tbf on $2 in $1 failed"
  done
}
link_unshape() {
  ip netns exec "$HOSTS_PREFIX-$1" tc qdisc del dev eth0 root 2>/dev/null || true
  ip netns exec "$HOSTS_PREFIX-switch" tc qdisc del dev "${HOST_OUTER[$1]}" root 2>/dev/null || true
}
# link_bytes NAME: bytes NAME's link carried so far, both directions (its veth's counters).
link_bytes() {
  ip -n "$HOSTS_PREFIX-$1" -s -j link show eth0 |
    /usr/bin/python3 -c 'import json, sys; s = json.load(sys.stdin)[0]["stats64"]; print(s["tx"]["bytes"] + s["rx"]["bytes"])'
}

# The environment of the processes in the namespaces: TCP over the veth only. Namespaces do
# not separate memory, so UCX and Open MPI would otherwise find their peers "on the same node"
# and use shared memory (UCX's posix/sysv/cma, Open MPI's vader): nothing would cross the link.
hosts_env() {
  export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
  export UCX_TLS=tcp UCX_NET_DEVICES=eth0
}
