#!/bin/sh
# Installs the idlegrid agent on a provider's host, enrolls it and starts it. One line, from the grid's Master:
#
#   curl -fsSL https://GRID/install.sh | sudo sh -s -- --token igjt_...
#
# Two ways to run the agent:
# - on the host (the default): the agent's package (GRID/dist/, built by the Master from its own source) goes into a
#   virtual environment (--prefix, /opt/idlegrid) and runs renters' work through the host's engine: Docker or Podman
#   (their Docker-compatible API socket), or, on a host with neither (--engine none), the process runtime's sandbox.
# - as a container (--image REF): the agent's image, built by deploy/build-images (no public registry has it), is
#   run by Docker or Podman with the engine's socket and the NVIDIA Container Toolkit's GPUs; its state lives in the
#   volume idlegrid-agent.
# Either way the host enrolls with the join token (the key is made on this host and never leaves it; only a CSR goes
# to the relay). A script served by a Master knows the grid's URL, its relay and its CA (GRID/ca.crt), so the token is
# all it needs; a copy from a checkout needs --grid, or --access and --ca-file. docs/install-provider.md explains it.
#
# Options:
#   --token TOKEN        one-time join token (the console's "Add a host" page, or the grid's operator)
#   --grid URL           the grid's Master, where the package and ca.crt are fetched (default: the Master that served
#                        this script)
#   --access URL         the relay's https:// enrollment URL (default: the relay the Master named when it served this)
#   --ca-file FILE       the grid's CA certificate, ca.crt (default: fetched from GRID/ca.crt)
#   --engine NAME        docker, podman or none (default: docker if installed, else podman, else none)
#   --socket PATH        the engine's API socket the agent runs containers through (default: the engine's usual
#                        one); "none" (with --image): no socket (the agent reports its GPUs but offers nothing to run)
#   --prefix DIR         the agent's virtual environment on the host (default /opt/idlegrid)
#   --state-dir DIR      the agent's state on the host: key, certificate, ledger (default /var/lib/idlegrid/agent)
#   --python PATH        the Python 3.11+ that makes the environment (default python3)
#   --pip-args ARGS      more arguments for pip (e.g. "--no-index --find-links /srv/wheels" on a host with no index)
#   --foreground         run the agent in this terminal rather than as a systemd unit (the host way)
#   --image REF          run the agent as a container from this image instead (default $IDLEGRID_AGENT_IMAGE if set)
#   --systemd            (with --image) start it through a systemd unit rather than the engine's restart policy
#   --name NAME          (with --image) the container's name (default idlegrid-agent); --volume NAME its volume
#   --no-gpus            (with --image) no GPU flags (a host without the NVIDIA Container Toolkit)
#   -- ARGS...           passed to `idlegrid agent` (e.g. -- --region eu-west --simulate h100:2 for a test)
set -eu

# Filled in by the Master that serves this script (GET /install.sh); empty in a checkout's copy.
served_grid=""
served_access=""
served_wheel=""

token="" grid="" access="" ca_file="" image="${IDLEGRID_AGENT_IMAGE:-}" engine="" socket=""
use_systemd=0 name=idlegrid-agent volume=idlegrid-agent gpus=1 network=host
prefix=/opt/idlegrid state_dir=/var/lib/idlegrid/agent python=python3 pip_args="" foreground=0

die() { echo "install.sh: $*" >&2; exit 1; }
usage() { [ -r "$0" ] && sed -n '2,/^set -eu/p' "$0" | sed -e '/^set -eu/d' -e 's/^# \{0,1\}//' || echo "see docs/install-provider.md"; }
say() { echo "install.sh: $*" >&2; }

while [ $# -gt 0 ]; do
    case "$1" in
        --token) token=${2:?--token needs a value}; shift 2 ;;
        --grid) grid=${2:?--grid needs a value}; shift 2 ;;
        --access) access=${2:?--access needs a value}; shift 2 ;;
        --ca-file) ca_file=${2:?--ca-file needs a value}; shift 2 ;;
        --image) image=${2:?--image needs a value}; shift 2 ;;
        --engine) engine=${2:?--engine needs a value}; shift 2 ;;
        --socket) socket=${2:?--socket needs a value}; shift 2 ;;
        --systemd) use_systemd=1; shift ;;
        --name) name=${2:?--name needs a value}; shift 2 ;;
        --volume) volume=${2:?--volume needs a value}; shift 2 ;;
        --no-gpus) gpus=0; shift ;;
        --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
        --state-dir) state_dir=${2:?--state-dir needs a value}; shift 2 ;;
        --python) python=${2:?--python needs a value}; shift 2 ;;
        --pip-args) pip_args=${2?--pip-args needs a value}; shift 2 ;;
        --foreground) foreground=1; shift ;;
        --) shift; break ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done

# --- the host way: the agent's package in a virtual environment, run by systemd (or in this terminal) ---------------
install_on_host() {
    [ -n "$grid" ] || die "--grid (the Master's URL) is needed to fetch the agent's package; or run it as a container (--image)"
    [ -n "$served_wheel" ] || die "this copy of install.sh does not name the agent's package: fetch it from the grid ($grid/install.sh)"
    "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
        die "$python is not Python 3.11 or newer (--python PATH names another)"
    runtime_flags="--runtime process"
    if [ "$engine" = none ] && [ "$(id -u)" = 0 ] && ! command -v slirp4netns >/dev/null 2>&1; then
        # Each sandboxed container gets a network of its own, whose way out is slirp4netns (docs/agent.md).
        if command -v apt-get >/dev/null 2>&1; then
            say "installing slirp4netns (each container's own network)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slirp4netns >/dev/null ||
                die "could not install slirp4netns, which the process runtime needs: install it and run this again"
        else
            die "the process runtime needs slirp4netns (each container's own network): install it and run this again"
        fi
    fi
    if [ "$engine" != none ]; then
        if [ -z "$socket" ]; then
            if [ "$engine" = docker ]; then socket=/var/run/docker.sock; else socket=/run/podman/podman.sock; fi
            if [ "$engine" = podman ] && [ ! -S "$socket" ] && command -v systemctl >/dev/null 2>&1; then
                systemctl enable --now podman.socket >/dev/null 2>&1 || true  # Podman's Docker-compatible API
            fi
        fi
        [ -S "$socket" ] || die "$socket is not the $engine API socket (is it running? --socket PATH names another)"
        runtime_flags="--runtime docker --docker-socket $socket"
    fi
    say "fetching the agent's package $served_wheel from $grid"
    fetch "$grid/dist/$served_wheel" "$workdir/$served_wheel" || die "could not fetch $grid/dist/$served_wheel"
    [ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix" || die "could not make a virtual environment in $prefix"
    say "installing it into $prefix"
    # shellcheck disable=SC2086
    "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check $pip_args "$workdir/$served_wheel" >&2 ||
        die "pip could not install $served_wheel and its dependencies into $prefix (--pip-args for an index or wheels)"
    mkdir -p "$state_dir" && chmod 0700 "$state_dir"
    if [ -n "$token" ]; then
        say "enrolling this host through $access"
        "$prefix/bin/idlegrid" agent enroll --state-dir "$state_dir" --token "$token" --access "$access" --ca-file "$ca_file" >&2 ||
            die "enrollment failed (a join token is used once: ask for a fresh one)"
    fi
    if [ "$foreground" = 1 ]; then
        say "starting the agent here ($runtime_flags); Ctrl-C stops it"
        rm -rf "$workdir"
        # shellcheck disable=SC2086
        exec "$prefix/bin/idlegrid" agent --state-dir "$state_dir" $runtime_flags "$@"
    fi
    if ! command -v systemctl >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
        say "installed and enrolled; no systemd here (or not root): start it with"
        say "  $prefix/bin/idlegrid agent --state-dir $state_dir $runtime_flags"
        return 0
    fi
    host_unit "$runtime_flags" "$*" >/etc/systemd/system/idlegrid-agent.service
    systemctl daemon-reload
    systemctl enable --now idlegrid-agent.service
    say "started: systemctl status idlegrid-agent; its log: journalctl -u idlegrid-agent"
}

# The unit of the host way. With an engine the agent needs only the engine's socket, and runs as root only because the
# socket is root's in effect; the process runtime must be root to run renters' commands as an unprivileged user.
host_unit() {
    cat <<HOSTUNIT
[Unit]
Description=idlegrid provider agent (installed by install.sh from $grid)
Wants=network-online.target
After=network-online.target

[Service]
Type=exec
ExecStart=$prefix/bin/idlegrid agent --state-dir $state_dir $1 $2
KillSignal=SIGTERM
TimeoutStopSec=30
Restart=on-failure
RestartSec=5
# 2: bad settings or not enrolled; 3: its certificate was revoked (enroll again). Restarting fixes neither.
RestartPreventExitStatus=2 3
ProtectHome=yes
PrivateTmp=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectClock=yes
UMask=0077

[Install]
WantedBy=multi-user.target
HOSTUNIT
}


grid=${grid:-$served_grid}
grid=${grid%/}
access=${access:-$served_access}
case "$engine" in ""|docker|podman|none) ;; *) die "--engine must be docker, podman or none, not $engine" ;; esac
[ -z "$image" ] || [ "$engine" != none ] || die "--image runs the agent in an engine: --engine none cannot run it"

workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

# fetch URL FILE: curl, else wget, else the Python that makes the environment.
fetch() {
    if command -v curl >/dev/null 2>&1; then curl -fsSL "$1" -o "$2"
    elif command -v wget >/dev/null 2>&1; then wget -q -O "$2" "$1"
    else "$python" -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])' "$1" "$2"
    fi
}

if [ -n "$token" ]; then
    [ -n "$access" ] || die "--access (the relay's https:// URL) is needed with --token: no relay was named by the grid"
    if [ -z "$ca_file" ]; then
        [ -n "$grid" ] || die "--ca-file (the grid's ca.crt) or --grid (the Master that serves it) is needed with --token"
        ca_file=$workdir/ca.crt
        fetch "$grid/ca.crt" "$ca_file" || die "could not fetch $grid/ca.crt (--ca-file FILE gives it instead)"
    fi
    [ -r "$ca_file" ] || die "cannot read $ca_file (--ca-file)"
fi

if [ -z "$engine" ]; then
    if command -v docker >/dev/null 2>&1; then engine=docker
    elif command -v podman >/dev/null 2>&1; then engine=podman
    elif [ -n "$image" ]; then die "neither docker nor podman is installed: --image needs one (and the NVIDIA Container Toolkit)"
    else engine=none
    fi
fi
if [ "$engine" != none ]; then
    command -v "$engine" >/dev/null 2>&1 || die "$engine is not installed"
    engine_path=$(command -v "$engine")
fi

if [ -z "$image" ]; then
    install_on_host "$@"
    exit 0
fi

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
