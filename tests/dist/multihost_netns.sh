#!/usr/bin/env bash
# Two "hosts" on one machine: Linux network namespaces joined by a veth pair, each with its
# own address (10.77.0.1 and 10.77.0.2). mpirun runs in the first and starts the second
# host's daemon through an rsh agent that enters that namespace, so OpenMPI's TCP transport
# (btl tcp, the only one allowed) carries every collective across the link, as between two
# machines. The job: `loom verify` of a 2-host data-parallel ZeRO-2 run of the tiny GPT-2
# against one process (EQUAL within 1e-5), then comm_bw's all-reduce bandwidth over the link.
# Needs root with CAP_NET_ADMIN (ip netns); exits 77 (ctest: skipped) with the reason
# otherwise. Leaves no namespace behind, also when it fails.
# usage: multihost_netns.sh LOOM COMM_BW SOURCE_DIR
set -u
loom=$1 comm_bw=$2 src=$3
ns_a=loom-host-a-$$ ns_b=loom-host-b-$$
tmp=$(mktemp -d)
cleanup() {
  ip netns del "$ns_a" 2> /dev/null
  ip netns del "$ns_b" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}
command -v ip > /dev/null || skip "no 'ip' command (iproute2)"
command -v mpirun > /dev/null || skip "no mpirun"
ip netns add "$ns_a" 2> "$tmp/err" || skip "cannot make a network namespace: $(cat "$tmp/err")"
ip netns add "$ns_b" || fail "second namespace"
ip link add "va$$" type veth peer name "vb$$" || fail "veth pair"
ip link set "va$$" netns "$ns_a" && ip link set "vb$$" netns "$ns_b" || fail "moving the veth ends"
ip -n "$ns_a" addr add 10.77.0.1/24 dev "va$$" && ip -n "$ns_b" addr add 10.77.0.2/24 dev "vb$$" ||
  fail "addresses"
for ns in "$ns_a" "$ns_b"; do
  ip -n "$ns" link set lo up || fail "lo up in $ns"
done
ip -n "$ns_a" link set "va$$" up && ip -n "$ns_b" link set "vb$$" up || fail "veth up"

# The rsh agent mpirun calls as `agent HOST COMMAND...`: run COMMAND in HOST's namespace.
cat > "$tmp/agent.sh" << AGENT
#!/usr/bin/env bash
host=\$1; shift
case "\$host" in
  10.77.0.1) ns=$ns_a ;;
  10.77.0.2) ns=$ns_b ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$tmp/agent.sh"
printf '10.77.0.1 slots=1\n10.77.0.2 slots=1\n' > "$tmp/hosts"

python3 - "$tmp/sft.jsonl" << 'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(48):
        f.write(json.dumps({"prompt": f"q{i}" + "?" * (i % 5),
                            "response": chr(97 + i % 26) * (1 + i * 7 % 19)}) + "\n")
PY
cat > "$tmp/cfg.json" << JSON
{"model": {"arch": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 256,
           "n_positions": 64},
 "data": {"path": "$tmp/sft.jsonl", "format": "prompt_response", "tokenizer": "bytes",
          "template": "plain", "seq_len": 40, "valid_fraction": 0.2, "cache_dir": "$tmp/cache"},
 "train_batch_size": 12, "gradient_accumulation_steps": 2, "train_steps": 8,
 "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
 "zero_optimization": {"stage": 2}}
JSON
mpirun_on_two_hosts() {
  ip netns exec "$ns_a" mpirun --allow-run-as-root -np 2 --hostfile "$tmp/hosts" \
    --mca plm_rsh_agent "$tmp/agent.sh" --mca btl tcp,self \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --bind-to none -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE "$@"
}
mpirun_on_two_hosts hostname > /dev/null 2> "$tmp/err" ||
  skip "mpirun cannot start a rank through the namespace agent: $(tail -3 "$tmp/err")"

link_bytes() { ip -n "$ns_a" -s link show "va$$" | awk '/RX:/{getline; rx=$1} /TX:/{getline; tx=$1} END{print rx + tx}'; }
before=$(link_bytes)
mpirun_on_two_hosts "$loom" verify "$tmp/cfg.json" > "$tmp/verify.log" 2>&1
rc=$?
after=$(link_bytes)
cat "$tmp/verify.log"
echo "bytes over the veth link during verify: $((after - before))"
[ $((after - before)) -gt 1000000 ] || fail "the job did not cross the link ($((after - before)) bytes)"
[ $rc -eq 0 ] || fail "verify across the two hosts exited $rc"
grep -q '^EQUAL: ' "$tmp/verify.log" || fail "no EQUAL verdict"
grep -q '2 ranks (data parallel 2' "$tmp/verify.log" || fail "not a 2-rank data-parallel job"

# The link's all-reduce bandwidth (what the README quotes).
mpirun_on_two_hosts "$comm_bw" > "$tmp/bw.log" 2>&1 || { cat "$tmp/bw.log"; fail "comm_bw"; }
cat "$tmp/bw.log"
echo "PASS: 2-host (network namespaces, TCP over veth) ZeRO-2 equals one process"
