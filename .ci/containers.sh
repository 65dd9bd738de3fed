#!/usr/bin/env bash
# CI, after the main suite: run the tests marked `container` through a Kafka container that testcontainers
# starts. No image registry is needed:
#   1. install Debian's docker.io when dockerd is missing;
#   2. start a private dockerd (own socket, data and exec roots under a temp dir) with no bridge network
#      and no iptables rules; containers use host networking, so all traffic stays on 127.0.0.1;
#   3. build the Kafka image FROM scratch out of this machine's Java and the cached Kafka jars;
#   4. run `pytest -m container` with the Ryuk reaper off (the plugin removes its containers itself);
#   5. remove the containers and the image this run created, stop dockerd by its PID, delete the temp dir.
# When dockerd cannot start here, the reason is printed and the tests run anyway: they are SKIPPED with
# the reason in pytest's summary. The exit status is pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."

python="${PYTHON:-.venv/bin/python}"  # the venv `make setup` creates
work=$(mktemp -d /tmp/epochline-containers.XXXXXX)
socket="$work/docker.sock"
image="epochline/kafka-local:ci-$(date +%s)"
dockerd_pid=""
image_built=no

stop_dockerd() {
    [[ -n "$dockerd_pid" ]] || return 0
    kill -TERM "$dockerd_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.2
    done
    if kill -0 "$dockerd_pid" 2>/dev/null; then
        echo "containers: dockerd (pid $dockerd_pid) ignored SIGTERM for 20s, killing it"
        kill -KILL "$dockerd_pid" 2>/dev/null || true
    fi
    wait "$dockerd_pid" 2>/dev/null || true
    dockerd_pid=""
}

cleanup() {
    if [[ -n "$dockerd_pid" ]]; then
        leftovers=$(docker -H "unix://$socket" ps -aq --filter label=org.testcontainers=true 2>/dev/null || true)
        if [[ -n "$leftovers" ]]; then
            echo "containers: removing containers left by the tests: $leftovers"
            # shellcheck disable=SC2086
            docker -H "unix://$socket" rm -f -v $leftovers >/dev/null || true
        fi
        if [[ "$image_built" == yes ]]; then
            docker -H "unix://$socket" rmi -f "$image" >/dev/null || true
        fi
    fi
    stop_dockerd
    # dockerd leaves its default network namespace mounted under its exec root
    awk -v root="$work/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r | while read -r mounted; do
        umount "$mounted" || true
    done
    rm -rf "$work" 2>/dev/null || echo "containers: could not remove all of $work"
}
trap cleanup EXIT

ensure_docker_installed() {
    command -v dockerd >/dev/null && return 0
    if [[ $(id -u) -ne 0 ]]; then
        echo "dockerd is not installed and installing docker.io needs root"
        return 1
    fi
    echo "== installing docker.io (Debian)" >&2
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >&2 \
        || { echo "apt-get install docker.io failed"; return 1; }
}

# Start dockerd with the given storage driver; succeed once it answers, fail if it exits or stays silent.
start_dockerd() {
    local driver=$1
    mkdir -p "$work/data-$driver" "$work/exec"
    dockerd --host "unix://$socket" --data-root "$work/data-$driver" --exec-root "$work/exec" \
        --pidfile "$work/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
        --storage-driver="$driver" >"$work/dockerd-$driver.log" 2>&1 &
    dockerd_pid=$!
    for _ in $(seq 1 60); do
        if docker -H "unix://$socket" info >/dev/null 2>&1; then
            return 0
        fi
        kill -0 "$dockerd_pid" 2>/dev/null || break
        sleep 0.5
    done
    stop_dockerd
    return 1
}

engine_reason=""
if ! install_problem=$(ensure_docker_installed); then
    engine_reason="$install_problem"
elif [[ $(id -u) -ne 0 ]]; then
    engine_reason="dockerd needs root to start (this script runs as uid $(id -u))"
elif start_dockerd overlay2; then
    echo "== dockerd running (pid $dockerd_pid, overlay2, socket $socket)"
elif start_dockerd vfs; then
    echo "== dockerd running (pid $dockerd_pid, vfs: overlay2 failed, see below)"
    tail -n 3 "$work/dockerd-overlay2.log"
else
    engine_reason="dockerd did not start with overlay2 nor vfs; last lines of its log:
$(tail -n 5 "$work/dockerd-vfs.log")"
fi

export DOCKER_HOST="unix://$socket"
export TESTCONTAINERS_RYUK_DISABLED=true
unset KAFKA_BOOTSTRAP

if [[ -z "$engine_reason" ]]; then
    echo "== building the Kafka image $image without a registry"
    PYTHON="$python" docker/build-local-kafka-image.sh "$image"
    image_built=yes
    export EPOCHLINE_KAFKA_IMAGE="$image"
else
    echo "containers: NO DOCKER ENGINE on this machine: $engine_reason"
    echo "containers: the tests marked 'container' will be SKIPPED (the reason is in pytest's summary)"
fi

echo "== tests marked 'container'"
status=0
"$python" -m pytest -m container -p no:cacheprovider -rs || status=$?
exit "$status"
