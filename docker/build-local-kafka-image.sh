#!/usr/bin/env bash
# Build epochline's Kafka image without any image registry.
#
#   docker/build-local-kafka-image.sh [IMAGE]      (default epochline/kafka-local:<KAFKA_VERSION>)
#
# The image is FROM scratch. Its root filesystem is assembled here from what this machine already has:
#   - a Java runtime: jlink'ed from the machine's JDK (or a copy of its JRE when there is no jlink),
#   - the shared libraries that runtime and /bin/sh link against (found with ldd),
#   - the Kafka jars engine.testing.local_broker.fetch_kafka_jars() fetched from Maven Central (cached),
#   - docker/kafka-local/: the entry point and the default single-node KRaft settings.
# The result answers to the same KAFKA_* settings as the official apache/kafka image, so
# EPOCHLINE_KAFKA_IMAGE can name either one. Environment: PYTHON (default .venv/bin/python, else python3).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then python="$PYTHON"
elif [[ -x .venv/bin/python ]]; then python=.venv/bin/python
else python=python3
fi

kafka_version=$("$python" -c "from engine.testing.local_broker import KAFKA_VERSION; print(KAFKA_VERSION)")
image="${1:-epochline/kafka-local:${kafka_version}}"
jars=$("$python" -c "from engine.testing.local_broker import fetch_kafka_jars; print(fetch_kafka_jars())")

java_bin=$(command -v java) || { echo "build-local-kafka-image: java is not on PATH" >&2; exit 1; }
java_home=$(dirname "$(dirname "$(readlink -f "$java_bin")")")

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs"/{bin,etc/kafka/docker,opt/kafka/config,opt/kafka/libs,mnt/shared/config,var/lib/kafka/data,tmp}
chmod 1777 "$rootfs/tmp"

# Modules a Kafka broker and its libraries use (management, SASL/Kerberos, TLS, JFR included).
modules=java.base,java.compiler,java.desktop,java.instrument,java.logging,java.management,java.management.rmi
modules+=,java.naming,java.net.http,java.rmi,java.scripting,java.security.jgss,java.security.sasl,java.sql
modules+=,java.transaction.xa,java.xml,jdk.crypto.ec,jdk.jfr,jdk.management,jdk.management.agent
modules+=,jdk.naming.dns,jdk.net,jdk.security.auth,jdk.unsupported,jdk.zipfs

if [[ -x "$java_home/bin/jlink" && -d "$java_home/jmods" ]]; then
    echo "== java runtime: jlink from $java_home"
    "$java_home/bin/jlink" --add-modules "$modules" --strip-debug --no-man-pages --no-header-files \
        --compress=2 --output "$rootfs/opt/java"
else
    echo "== java runtime: copy of $java_home (no jlink)"
    mkdir -p "$rootfs/opt/java"
    cp -rL "$java_home/bin" "$java_home/conf" "$java_home/lib" "$java_home/release" "$rootfs/opt/java/"
fi

echo "== /bin/sh and shared libraries"
cp -L /bin/sh "$rootfs/bin/sh"
mapfile -t linked < <(
    find "$rootfs/opt/java" "$rootfs/bin" -type f \( -name '*.so' -o -perm -u+x \) -print0 \
        | xargs -0 ldd 2>/dev/null \
        | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// && $1 !~ /:$/ { print $1 }' \
        | sort -u
)
for library in "${linked[@]}"; do
    cp -L --parents "$library" "$rootfs/"
done
printf 'hosts: files dns\n' > "$rootfs/etc/nsswitch.conf"

echo "== kafka $kafka_version jars from $jars"
cp "$jars"/*.jar "$rootfs/opt/kafka/libs/"
cp docker/kafka-local/run docker/kafka-local/server.properties docker/kafka-local/*.yaml "$rootfs/etc/kafka/docker/"
cp docker/kafka-local/Dockerfile "$context/Dockerfile"

echo "== docker build $image ($(du -sh "$rootfs" | cut -f1) root filesystem)"
DOCKER_BUILDKIT=0 docker build --quiet --label org.epochline.image=kafka-local --tag "$image" "$context"
echo "$image"
