#!/usr/bin/env bash
# Peak memory of the example operator as deployed: the operator process and
# its helm children together (one container, one cgroup), sampled every
# 0.2 s while N Platforms using every feature (the metrics Helm release,
# dashboards, the remote agent, a fleet of one member) are provisioned at
# once and then deleted. What `resources.limits.memory` in operator.yaml is
# set from (docs/benchmarks.md, "The example operator's memory").
#
#   cargo xtask bench memory   # clusters of its own, the release build
#
# or by hand, on clusters of yours:
#
#   cargo xtask cluster up && cargo xtask cluster up --name remote
#   eval "$(cargo xtask cluster env)"   # or set the variables below
#   cargo build -p platform-operator
#   examples/platform-operator/deploy/measure-memory.sh 16
#
# N defaults to 16: twice the 8 helm processes the operator runs at once by
# default, so the helm slots stay full while the releases install and while
# they are uninstalled. Needs KUBECONFIG (the cluster), and
# PROVISIONERS_REMOTE_KUBECONFIG (the remote cluster, which is also the
# fleet's member); OPERATOR (default target/debug/platform-operator), HELM
# (default $PROVISIONERS_HELM4) and KUBECTL (default $PROVISIONERS_KUBECTL,
# else kubectl) may be set.
set -euo pipefail

n=${1:-16}
operator=${OPERATOR:-target/debug/platform-operator}
helm=${HELM:-${PROVISIONERS_HELM4:?set HELM or PROVISIONERS_HELM4}}
kubectl=${KUBECTL:-${PROVISIONERS_KUBECTL:-kubectl}}
remote=${PROVISIONERS_REMOTE_KUBECONFIG:?set it to the kubeconfig of the remote cluster}
ns="memory-$$"
fleet_ns=platform-fleet
work=$(mktemp -d)
trap 'kill "$sampler" "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT

"$kubectl" create namespace "$ns" >/dev/null
"$kubectl" create namespace "$fleet_ns" 2>/dev/null || true
"$kubectl" -n "$ns" create secret generic workload --from-file=kubeconfig="$remote" >/dev/null
"$kubectl" -n "$fleet_ns" create secret generic "$ns-kubeconfig" --from-file=value="$remote" >/dev/null
"$kubectl" -n "$fleet_ns" label secret "$ns-kubeconfig" \
  "cluster.x-k8s.io/cluster-name=$ns" "platform.example.com/tenant=$ns" >/dev/null

"$operator" --helm "$helm" --metrics-addr off --allow-remote-range 127.0.0.0/8 \
  --log-format json >"$work/operator.log" 2>&1 &
pid=$!

# The summed RSS (KiB) of the operator and every process below it.
tree_rss() {
  ps -e -o pid=,ppid=,rss= | awk -v root="$1" '
    { parent[$1] = $2; rss[$1] = $3 }
    END {
      for (p in rss) {
        q = p
        while (q != root && q in parent && q != 0 && q != 1) q = parent[q]
        if (q == root) { total += rss[p]; if (p != root) helm += rss[p] }
      }
      printf "%d %d %d\n", total, rss[root], helm
    }'
}
(
  peak=0 peak_op=0 peak_helm=0
  while kill -0 "$pid" 2>/dev/null; do
    read -r total op helm_kib < <(tree_rss "$pid")
    ((total > peak)) && peak=$total
    ((op > peak_op)) && peak_op=$op
    ((helm_kib > peak_helm)) && peak_helm=$helm_kib
    echo "$peak $peak_op $peak_helm" >"$work/peak"
    sleep 0.2
  done
) &
sampler=$!

until "$kubectl" get crd platforms.example.com >/dev/null 2>&1; do sleep 0.5; done
"$kubectl" wait --for condition=established crd/platforms.example.com --timeout=60s >/dev/null
started=$(date +%s)
for i in $(seq 1 "$n"); do
  cat <<EOF
apiVersion: example.com/v1
kind: Platform
metadata:
  name: p$i
  namespace: $ns
spec:
  metrics: true
  dashboards: true
  remote:
    secretName: workload
  fleet: {}
---
EOF
done | "$kubectl" apply -f - >/dev/null

count_available() {
  "$kubectl" -n "$ns" get platforms \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Available")].status}{"\n"}{end}' |
    grep -c '^True$' || true
}
until [ "$(count_available)" -ge "$n" ]; do
  if (($(date +%s) - started > 900)); then
    echo "only $(count_available) of $n Available after 900 s" >&2
    exit 1
  fi
  sleep 1
done
available=$(($(date +%s) - started))
"$kubectl" -n "$ns" delete platforms --all --wait=false >/dev/null
until [ -z "$("$kubectl" -n "$ns" get platforms -o name)" ]; do sleep 1; done
gone=$(($(date +%s) - started))

read -r peak peak_op peak_helm <"$work/peak"
echo "$n Platforms, every feature: all Available after ${available} s, all gone after ${gone} s"
echo "peak RSS, operator and helm children together: $((peak / 1024)) MiB"
echo "peak RSS of the operator alone: $((peak_op / 1024)) MiB; of the helm children together: $((peak_helm / 1024)) MiB"
kill "$pid"
wait "$pid" 2>/dev/null || true
"$kubectl" -n "$fleet_ns" delete secret "$ns-kubeconfig" >/dev/null
"$kubectl" delete namespace "$ns" --wait=false >/dev/null
