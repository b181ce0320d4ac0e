#!/bin/sh
# Installs the idlegrid agent on a provider's host as a container, enrolls it and starts it. One line:
#
#   curl -fsSL https://GRID/install.sh | sudo sh -s -- --token igjt_... --access https://relay.example:7201 --ca-file ca.crt
#
# What it does: finds the container engine (Docker, else Podman), gets the agent's image, enrolls the host with the
# join token (the key is made on this host and never leaves it; only a CSR goes to the relay), then starts the agent
# with the engine's socket and the NVIDIA Container Toolkit's GPUs. Docker restarts it by itself
# (--restart unless-stopped); with --systemd, or with Podman, a systemd unit (idlegrid-agent-container.service) does.
# Its state (key, certificate, ledger) lives in the volume idlegrid-agent. docs/install-provider.md explains it all.
#
# Options:
#   --token TOKEN        one-time join token from the grid's operator (required unless already enrolled)
#   --access URL         the relay's https:// enrollment URL (required with --token)
#   --ca-file FILE       the grid's CA certificate, ca.crt (required with --token)
#   --image REF          the agent's image (default $IDLEGRID_AGENT_IMAGE, else localhost/idlegrid-agent:latest)
#   --engine NAME        docker or podman (default: docker if installed, else podman)
#   --socket PATH        the engine's API socket the agent runs containers through (default: the engine's usual
#                        one); "none": no socket (the agent reports its GPUs but offers nothing to run)
#   --systemd            start it through a systemd unit rather than the engine's restart policy
#   --name NAME          the container's name (default idlegrid-agent); --volume NAME its volume (default idlegrid-agent)
#   --no-gpus            no GPU flags (a host without the NVIDIA Container Toolkit)
#   -- ARGS...           passed to `idlegrid agent` (e.g. -- --region eu-west --simulate h100:2 for a test)
set -eu

token="" access="" ca_file="" image="${IDLEGRID_AGENT_IMAGE:-localhost/idlegrid-agent:latest}" engine="" socket=""
use_systemd=0 name=idlegrid-agent volume=idlegrid-agent gpus=1 network=host

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --token) token=${2:?--token needs a value}; shift 2 ;;
        --access) access=${2:?--access needs a value}; shift 2 ;;
        --ca-file) ca_file=${2:?--ca-file needs a value}; shift 2 ;;
        --image) image=${2:?--image needs a value}; shift 2 ;;
        --engine) engine=${2:?--engine needs a value}; shift 2 ;;
        --socket) socket=${2:?--socket needs a value}; shift 2 ;;
        --systemd) use_systemd=1; shift ;;
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --volume) volume=${2:?--volume needs a value}; shift 2 ;;
        --no-gpus) gpus=0; shift ;;
        --) shift; break ;;
        -h|--help) sed -n '2,/^set -eu/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

if [ -n "$token" ]; then
    [ -n "$access" ] || die "--access (the relay's https:// URL) is needed with --token"
    [ -n "$ca_file" ] || die "--ca-file (the grid's ca.crt) is needed with --token"
    [ -r "$ca_file" ] || die "cannot read $ca_file (--ca-file)"
fi

if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null 2>&1; then engine=podman
    else die "neither docker nor podman is installed: install one (and the NVIDIA Container Toolkit), then run this again"
    fi
fi
case "$engine" in docker|podman) ;; *) die "--engine must be docker or podman, not $engine" ;; esac
command -v "$engine" >/dev/null 2>&1 || die "$engine is not installed"
engine_path=$(command -v "$engine")

if [ -z "$socket" ]; then
    if [ "$engine" = docker ]; then socket=/var/run/docker.sock; else socket=/run/podman/podman.sock; fi
    if [ "$engine" = podman ] && [ ! -S "$socket" ] && command -v systemctl >/dev/null 2>&1; then
        systemctl enable --now podman.socket >/dev/null 2>&1 || true  # Podman's Docker-compatible API
    fi
fi
socket_flags="" socket_gid=0
if [ "$socket" != none ]; then
    [ -S "$socket" ] || die "$socket is not the engine's API socket (is the engine running? --socket PATH names another)"
    socket_gid=$(stat -c %g "$socket")
    socket_flags="--volume $socket:/var/run/docker.sock --group-add $socket_gid"
fi

gpu_flags=""
if [ "$gpus" = 1 ]; then
    if [ "$engine" = docker ]; then
        if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then gpu_flags="--gpus all"; fi
    elif [ -e /etc/cdi/nvidia.yaml ] || [ -e /var/run/cdi/nvidia.yaml ]; then
        gpu_flags="--device nvidia.com/gpu=all"
    fi
    [ -n "$gpu_flags" ] || say "no NVIDIA Container Toolkit found for $engine: the agent will see no GPUs (install it, run this again)"
fi

if ! "$engine" image inspect "$image" >/dev/null 2>&1; then
    say "pulling $image"
    "$engine" pull "$image" >/dev/null || die "could not get $image"
fi
"$engine" volume inspect "$volume" >/dev/null 2>&1 || "$engine" volume create "$volume" >/dev/null

# The agent never runs as root, whatever the image says: uid 10001 owns the volume in the image.
run_as="--user 10001:10001"

if [ -n "$token" ]; then
    ca_abs=$(cd "$(dirname "$ca_file")" && pwd)/$(basename "$ca_file")
    say "enrolling this host through $access"
    # shellcheck disable=SC2086
    "$engine" run --rm $run_as --network "$network" --volume "$volume:/var/lib/idlegrid" \
        --volume "$ca_abs:/etc/idlegrid/ca.crt:ro" "$image" \
        enroll --token "$token" --access "$access" --ca-file /etc/idlegrid/ca.crt >&2
fi

# deploy/systemd/idlegrid-agent-container.service, kept here so that `curl ... | sh` has it (a test keeps them equal).
container_unit() {
    cat <<'UNIT'
# The agent's image run by systemd, for hosts whose engine has no restart policy of its own (Podman without a
# service, for one). deploy/agent/install.sh --systemd installs it (a copy of this file is in the script), writes
# /etc/default/idlegrid-agent and enables it.
# The container itself runs as an unprivileged user with the state in the idlegrid-agent volume; the engine needs
# root, so the unit's own hardening is what an engine leaves possible.
[Unit]
Description=idlegrid provider agent (container)
Documentation=file:///opt/idlegrid/share/doc/idlegrid/install-provider.md
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
# ENGINE (docker or podman), IMAGE, SOCKET (the engine's API socket), SOCKET_GID (its group) and GPU_FLAGS
# (--gpus all for Docker, --device nvidia.com/gpu=all for Podman with CDI): written by install.sh.
Environment=ENGINE=/usr/bin/podman IMAGE=localhost/idlegrid-agent:latest SOCKET=/run/podman/podman.sock SOCKET_GID=0
Environment=GPU_FLAGS=--device=nvidia.com/gpu=all
EnvironmentFile=-/etc/default/idlegrid-agent
# $$: the shell, not systemd, reads these variables (GPU_FLAGS is split into words, the others are not).
ExecStartPre=-/bin/sh -c 'exec "$$ENGINE" rm --force idlegrid-agent'
ExecStart=/bin/sh -c 'exec "$$ENGINE" run --rm --name idlegrid-agent --user 10001:10001 --network host \
    --volume idlegrid-agent:/var/lib/idlegrid --volume "$$SOCKET:/var/run/docker.sock" --group-add "$$SOCKET_GID" \
    --security-opt no-new-privileges $$GPU_FLAGS "$$IMAGE"'
ExecStop=/bin/sh -c 'exec "$$ENGINE" stop --time 30 idlegrid-agent'
TimeoutStopSec=45
Restart=on-failure
RestartSec=5
RestartPreventExitStatus=2 3
PrivateTmp=yes
ProtectHome=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectClock=yes

[Install]
WantedBy=multi-user.target
UNIT
}

"$engine" rm --force "$name" >/dev/null 2>&1 || true
if [ "$use_systemd" = 1 ] || { [ "$engine" = podman ] && [ "$name" = idlegrid-agent ] && command -v systemctl >/dev/null 2>&1; }; then
    [ "$name" = idlegrid-agent ] || die "--systemd runs the container named idlegrid-agent; leave --name out"
    [ "$volume" = idlegrid-agent ] || die "--systemd uses the volume idlegrid-agent; leave --volume out"
    [ $# -eq 0 ] || die "--systemd takes no agent arguments; put settings in the volume's config or IDLEGRID_AGENT_* variables"
    [ "$socket" != none ] || die "--systemd runs the agent with the engine's socket; --socket none is for tests"
    container_unit >/etc/systemd/system/idlegrid-agent-container.service
    printf 'ENGINE=%s\nIMAGE=%s\nSOCKET=%s\nSOCKET_GID=%s\nGPU_FLAGS=%s\n' \
        "$engine_path" "$image" "$socket" "$socket_gid" "$gpu_flags" >/etc/default/idlegrid-agent
    systemctl daemon-reload
    systemctl enable --now idlegrid-agent-container.service
    say "started: systemctl status idlegrid-agent-container; its log: journalctl -u idlegrid-agent-container"
else
    # shellcheck disable=SC2086
    "$engine" run --detach --name "$name" --restart unless-stopped $run_as --network "$network" \
        --security-opt no-new-privileges --volume "$volume:/var/lib/idlegrid" $socket_flags $gpu_flags "$image" "$@" >/dev/null
    say "started: $engine logs -f $name"
fi
