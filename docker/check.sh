#!/usr/bin/env bash
# Builds the image and runs it for real: every role from containers, as docker/README.md shows.
#
#   docker/check.sh                 # docker if its engine answers, else podman (see below)
#   CONTAINER_RUNTIME=podman docker/check.sh
#   docker/check.sh frontend-two-hosts    # some steps only (the image must exist without build)
#
# 1. builds docker/Dockerfile (the fast tests run in the build) and prints the image's help;
# 2. trains Pong for a few thousand frames with `docker run`: one learner (no mpirun) and two
#    actors, each in its own container, host networking, the run folder a mounted volume;
# 3. plays the trained run with --mode=test from the image, recording a video;
# 4. trains with two learners in two containers, as on two hosts: mpirun in the first reaches
#    the second, an `sshd` container, over SSH;
# 5. runs the same through the frontend (run_experiment_mm_raw.py --docker_image) with a local
#    workers CSV: start, status, and stop, after which no container of the run is left; then
#    with learners on two hosts (this one and 127.0.0.3, reached over SSH).
# Exits non-zero, saying which step failed, if anything does.
#
# Where no Docker engine runs (as on Debian machines without one), podman with runc does, given:
# a base image made locally with debootstrap (no registry needed), a containers.conf without
# default ulimits and with the cgroupfs manager, and host networking. This script sets those up
# under $IMPALA_CACHE_DIR (default ~/.cache/impala-horovod/podman) when it uses podman as root.
#
# Environment:
#   CONTAINER_RUNTIME  docker or podman (default: docker if `docker info` answers, else podman)
#   IMAGE              the tag to build (default impala-horovod:check)
#   BASE_IMAGE         the Debian 12 base (default: debian:bookworm; with podman, a local one)
#   PIP_CERT           a CA bundle pip needs where a proxy re-signs TLS (default: the host's, if
#                      /etc/ssl/certs/ca-certificates.crt exists)
#   RUN_TESTS          0 skips the fast tests in the build (default 1)
#   HOROVOD_CACHE      podman only: this machine's built Horovod wheels, mounted into the build
#                      (default: scripts/setup.sh's cache); empty: the image compiles its own
#   NO_CACHE           1: build every layer anew (with HOROVOD_CACHE= : the whole set-up, the
#                      Horovod compile included, as on a machine that never built the image)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
IMAGE=${IMAGE:-impala-horovod:check}
CACHE=${IMPALA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/impala-horovod}/podman
say() { printf '\n[check] %s\n' "$*" >&2; }
die() { printf '[check] FAILED: %s\n' "$*" >&2; exit 1; }

choose_runtime() {
  if [[ -n ${CONTAINER_RUNTIME:-} ]]; then
    read -r -a RT <<<"$CONTAINER_RUNTIME"
  elif command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    RT=(docker)
  elif command -v podman >/dev/null; then
    RT=(podman)
  else
    die "no container runtime: install Docker, or podman (apt-get install podman runc catatonit)"
  fi
  if [[ ${RT[0]} == podman ]]; then
    setup_podman
  fi
  say "container runtime: ${RT[*]}"
}

setup_podman() {
  # crun fails on some cgroup layouts and podman's default ulimits can exceed a machine's hard
  # limits: use runc, cgroupfs and no default ulimits.
  mkdir -p "$CACHE"
  if [[ -z ${CONTAINERS_CONF:-} ]]; then
    export CONTAINERS_CONF=$CACHE/containers.conf
    printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n' \
      >"$CONTAINERS_CONF"
  fi
  command -v runc >/dev/null && RT+=(--runtime runc)
  if [[ -z ${BASE_IMAGE:-} ]]; then
    BASE_IMAGE=localhost/debian:bookworm
    if ! "${RT[@]}" image exists "$BASE_IMAGE"; then
      command -v debootstrap >/dev/null || die "no $BASE_IMAGE and no debootstrap to make it"
      local mirror rootfs
      mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources \
        2>/dev/null | head -n1)
      mirror=${mirror:-http://deb.debian.org/debian}
      rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
      say "making $BASE_IMAGE with debootstrap from $mirror"
      debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
        || die "debootstrap failed: $CACHE/debootstrap.log"
      tar -C "$rootfs" -c . | "${RT[@]}" import - "$BASE_IMAGE" >/dev/null
      rm -rf "$rootfs"
    fi
  fi
}

build() {
  local args=(build -f docker/Dockerfile -t "$IMAGE" --network=host)
  [[ -n ${BASE_IMAGE:-} ]] && args+=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
  args+=(--build-arg "RUN_TESTS=${RUN_TESTS:-1}")
  [[ -n ${NO_CACHE:-} ]] && args+=(--no-cache)
  if [[ ${RT[0]} == podman ]]; then
    args+=(--format docker)  # OCI images drop SHELL
    # The host's CA bundle (where a proxy re-signs TLS), mounted beside the image's own, which
    # its ca-certificates writes. `docker build` mounts nothing: pip uses its own bundle there.
    local cert=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
    if [[ -f $cert ]]; then
      args+=(--build-arg "PIP_CERT=/run/host-certs/$(basename "$cert")")
      args+=(-v "$(dirname "$(realpath "$cert")"):/run/host-certs:ro")
    fi
  fi
  # With podman, the build can use this machine's cache of built Horovod wheels (the one
  # scripts/setup.sh keeps, keyed by every version that matters): a rebuild of the stack then
  # skips the compile. HOROVOD_CACHE= (empty) makes the image compile its own.
  local wheels=${HOROVOD_CACHE-${IMPALA_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/impala-horovod}}
  if [[ ${RT[0]} == podman && -n $wheels && -d $wheels ]]; then
    args+=(-v "$wheels:/var/cache/impala-horovod")
    say "Horovod wheels from $wheels"
  fi
  say "building $IMAGE (the first build compiles Horovod: about 10 minutes on 2 cores)"
  local start=$SECONDS
  "${RT[@]}" "${args[@]}" . || die "the image did not build"
  say "built in $((SECONDS - start)) s: $("${RT[@]}" image inspect --format '{{.Size}}' "$IMAGE" \
    | awk '{printf "%.2f GB", $1 / 1e9}')"
  local help
  help=$("${RT[@]}" run --rm "$IMAGE")
  [[ $help == *"every role of a run"* ]] || die "the image's help"
  head -n 3 <<<"$help"
}

remove() {  # remove NAME...: the containers, running or not, if they exist
  local name
  for name in "$@"; do "${RT[@]}" rm -f "$name" >/dev/null 2>&1 || true; done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Runs the image as README's recipes do: host network, this user's uid, the run folder mounted.
run() {
  "${RT[@]}" run --rm --init --network=host --user "$(id -u):$(id -g)" \
    --cap-drop=ALL --security-opt=no-new-privileges -v "$RUNS:/opt/impala/runs" "$@"
}

train_with_docker_run() {
  local port name=docker-run flags
  port=$(free_port)
  flags=(--learner_hosts="127.0.0.1:$port" --actor_hosts=127.0.0.1,127.0.0.1
         --experiment="$name" --level_name=PongNoFrameskip-v4 --num_envs_per_actor=4
         --batch_size=4 --total_environment_frames=8000 --connect_timeout_secs=120)
  say "training Pong for 8,000 frames: a learner and two actors, each in a container"
  run --name impala-check-learner \
    "$IMAGE" python -u experiment.py --job_name=learner "${flags[@]}" >"$RUNS/learner.out" 2>&1 &
  local learner=$!
  local actors=()
  for task in 0 1; do
    run --name "impala-check-actor-$task" "$IMAGE" python -u experiment.py --job_name=actor \
      --task="$task" "${flags[@]}" >"$RUNS/actor_$task.out" 2>&1 &
    actors+=($!)
  done
  if ! timeout 600 tail --pid="$learner" -f /dev/null; then
    remove impala-check-learner impala-check-actor-0 impala-check-actor-1
    die "the learner did not finish within 10 minutes: $RUNS/learner.out"
  fi
  wait "$learner" || { tail -n 20 "$RUNS/learner.out" >&2; die "the learner failed"; }
  for pid in "${actors[@]}"; do
    wait "$pid" || { tail -n 20 "$RUNS"/actor_*.out >&2; die "an actor failed"; }
  done
  grep -E "frames .*/8,?000|done" "$RUNS/learner.out" | tail -n 2
  [[ -s $RUNS/$name/checkpoints/checkpoint ]] || die "no checkpoint in $RUNS/$name"
  [[ $(stat -c %u "$RUNS/$name/checkpoints/checkpoint") == "$(id -u)" ]] \
    || die "the run folder's files do not belong to $(id -un)"
  say "playing the trained run with --mode=test, recording a video"
  run "$IMAGE" python experiment.py --mode=test --experiment="$name" --test_num_episodes=1 \
    --record_video | tail -n 3
  compgen -G "$RUNS/$name/videos/*/*.mp4" >/dev/null || die "no video in $RUNS/$name/videos"
  ls "$RUNS/$name"/videos/*/*.mp4
}

learners_across_containers() {
  # Two learners, each in its own container, as on two hosts: rank 1 on 127.0.0.3 runs in an
  # sshd container, which mpirun in the first container reaches over SSH (docker/README.md).
  local keys=$RUNS/ssh name=two-learners sshd_port ports flags
  mkdir -m 700 "$keys"
  ssh-keygen -q -t ed25519 -N '' -f "$keys/id_ed25519"
  ssh-keygen -q -t ed25519 -N '' -f "$keys/host_key"
  cp "$keys/id_ed25519.pub" "$keys/authorized_keys" && chmod 600 "$keys/authorized_keys"
  sshd_port=$(free_port)
  echo "[127.0.0.3]:$sshd_port $(cut -d' ' -f1,2 "$keys/host_key.pub")" >"$keys/known_hosts"
  ports=("$(free_port)" "$(free_port)")
  flags=(--learner_hosts="localhost:${ports[0]},127.0.0.3:${ports[1]}"
         --actor_hosts=127.0.0.1,127.0.0.1 --experiment="$name" --level_name=PongNoFrameskip-v4
         --num_envs_per_actor=4 --batch_size=4 --total_environment_frames=8000
         --connect_timeout_secs=120)
  say "two learners in two containers, mpirun reaching the second over the sshd role"
  run -d --name impala-check-sshd --cap-add=SYS_CHROOT --cap-add=SETGID --cap-add=SETUID \
    -v "$keys:/ssh:ro" "$IMAGE" sshd "$sshd_port" /ssh >/dev/null
  local deadline=$((SECONDS + 30))
  until (exec 3<>"/dev/tcp/127.0.0.3/$sshd_port") 2>/dev/null; do
    ((SECONDS < deadline)) || die "the sshd role did not listen: $("${RT[@]}" logs impala-check-sshd)"
    sleep 1
  done
  run --name impala-check-learners -v "$keys:/ssh:ro" \
    -e OMPI_ALLOW_RUN_AS_ROOT=1 -e OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$IMAGE" \
    mpirun -np 2 -H localhost:1,127.0.0.3:1 --bind-to none -x PYTHONUNBUFFERED=1 \
    --mca plm_rsh_args "-p $sshd_port -i /ssh/id_ed25519 -o UserKnownHostsFile=/ssh/known_hosts" \
    --mca plm_rsh_no_tree_spawn 1 -wdir /opt/impala \
    /opt/impala/.venv/bin/python -u experiment.py --job_name=learner "${flags[@]}" \
    >"$RUNS/learners.out" 2>&1 &
  local learners=$! actors=()
  for task in 0 1; do
    run --name "impala-check-actor-$task" "$IMAGE" python -u experiment.py --job_name=actor \
      --task="$task" "${flags[@]}" >"$RUNS/two_actor_$task.out" 2>&1 &
    actors+=($!)
  done
  local ok=1
  timeout 600 tail --pid="$learners" -f /dev/null && wait "$learners" || ok=0
  for pid in "${actors[@]}"; do wait "$pid" || ok=0; done
  remove impala-check-sshd impala-check-learners impala-check-actor-0 impala-check-actor-1
  ((ok)) || { tail -n 20 "$RUNS/learners.out" >&2; die "two learners across containers"; }
  tail -n 3 "$RUNS/learners.out"
  [[ -s $RUNS/$name/checkpoints/checkpoint ]] || die "no checkpoint in $RUNS/$name"
  [[ -s $RUNS/$name/learner_1.json ]] || die "rank 1 (in the sshd container) left no report"
}

frontend_runtime() {  # the runtime as the frontend's windows run it, with this check's podman set-up
  if [[ ${RT[0]} == podman && -n ${CONTAINERS_CONF:-} ]]; then
    printf 'env CONTAINERS_CONF=%s %s' "$CONTAINERS_CONF" "${RT[*]}"
  else
    printf '%s' "${RT[*]}"
  fi
}

frontend_learners_on_two_hosts() {
  # Learners on this host (localhost) and on 127.0.0.3, which the frontend reaches over SSH
  # (an sshd of this check's own) and where it starts an sshd container for mpirun.
  local dir=$RUNS/host-ssh name=two-hosts ssh_port sshd_port csv runtime sshd
  mkdir -m 700 "$dir"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/client_key"
  cp "$dir/client_key.pub" "$dir/authorized_keys"
  ssh_port=$(free_port)
  sshd_port=$(free_port)
  printf '%s\n' "Port $ssh_port" "ListenAddress 127.0.0.3" "HostKey $dir/host_key" \
    "AuthorizedKeysFile $dir/authorized_keys" "PidFile $dir/sshd.pid" "StrictModes no" \
    "UsePAM no" "PasswordAuthentication no" "KbdInteractiveAuthentication no" \
    "PermitRootLogin prohibit-password" >"$dir/sshd_config"
  [[ $EUID != 0 ]] || mkdir -p /run/sshd
  /usr/sbin/sshd -D -e -f "$dir/sshd_config" 2>"$dir/sshd.log" &
  sshd=$!
  echo "[127.0.0.3]:$ssh_port $(cut -d' ' -f1,2 "$dir/host_key.pub")" >"$dir/known_hosts"
  csv=$RUNS/two_hosts.csv
  printf 'job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir\n' >"$csv"
  printf 'learner,localhost,%s,22,,,,%s\n' "$(free_port)" "$RUNS" >>"$csv"
  printf 'learner,127.0.0.3,%s,%s,%s,%s,,%s\n' "$(free_port)" "$ssh_port" "$(id -un)" \
    "$dir/client_key" "$RUNS/host2" >>"$csv"
  printf 'actor,localhost,,22,,,,%s\nactor,127.0.0.3,,%s,%s,%s,,%s\n' "$RUNS" "$ssh_port" \
    "$(id -un)" "$dir/client_key" "$RUNS/host2" >>"$csv"
  mkdir -p "$RUNS/host2"
  runtime=$(frontend_runtime)
  local frontend=(.venv/bin/python run_experiment_mm_raw.py --workers_csv_path="$csv"
    --run_name="$name" --logdir=runs --docker_image="$IMAGE" --container_runtime="$runtime"
    --container_sshd_port="$sshd_port" --known_hosts="$dir/known_hosts"
    --level_name=PongNoFrameskip-v4 --num_envs_per_actor=4 --batch_size=4
    --total_environment_frames=400000)
  say "the frontend: learners in containers on two hosts, mpirun through an sshd container"
  "${frontend[@]}" --dry_run | grep -E "^(# |window sshd|write .*mpi_ssh)" | cut -c1-150
  "${frontend[@]}" --action=start || { kill "$sshd"; die "the two-host start"; }
  local deadline=$((SECONDS + 300))
  until grep -qs "frames/s" "$RUNS/runs/$name/learners.log"; do
    if ((SECONDS >= deadline)); then
      "${frontend[@]}" --action=stop; kill "$sshd"
      tail -n 20 "$RUNS/runs/$name/learners.log" >&2; die "no progress from two hosts' learners"
    fi
    sleep 5
  done
  "${frontend[@]}" --action=status
  "${frontend[@]}" --action=stop
  kill "$sshd"
  rm -rf "$ROOT/runs/$name"  # the frontend's own copy of the run's secret and keys
  # rank 1 ran in the sshd container on "127.0.0.3": its report is in that host's run folder
  [[ -s $RUNS/host2/runs/$name/learner_1.json ]] || die "rank 1 left no report on 127.0.0.3"
  [[ ! -e $RUNS/runs/$name/learner_1.json ]] || die "rank 1 ran on the first host"
  [[ -s $RUNS/runs/$name/checkpoints/checkpoint ]] || die "the stop saved no checkpoint"
  [[ -z $("${RT[@]}" ps -aq --filter "label=impala.run") ]] || die "containers left after stop"
}

frontend_with_containers() {
  local port csv name=frontend runtime
  port=$(free_port)
  csv=$RUNS/workers.csv
  printf 'job,host,tf_port,ssh_port,ssh_user,ssh_key,cuda_visible_devices,workdir\n' >"$csv"
  printf 'learner,localhost,%s,22,,,,%s\n' "$port" "$RUNS" >>"$csv"
  printf 'actor,localhost,,22,,,,%s\nactor,localhost,,22,,,,%s\n' "$RUNS" "$RUNS" >>"$csv"
  runtime=$(frontend_runtime)
  local frontend=(.venv/bin/python run_experiment_mm_raw.py --workers_csv_path="$csv"
    --run_name="$name" --logdir="$RUNS/fruns" --docker_image="$IMAGE" --container_runtime="$runtime"
    --level_name=PongNoFrameskip-v4 --num_envs_per_actor=4 --batch_size=4
    --total_environment_frames=400000)
  say "the frontend: start, status and stop a run in containers"
  "${frontend[@]}" --action=start
  local deadline=$((SECONDS + 300))
  until grep -qs "frames/s" "$RUNS/fruns/$name/learners.log"; do
    ((SECONDS < deadline)) || { "${frontend[@]}" --action=stop; die "no progress from the learners"; }
    sleep 5
  done
  "${frontend[@]}" --action=status
  "${frontend[@]}" --action=stop
  [[ -s $RUNS/fruns/$name/checkpoints/checkpoint ]] || die "the stop saved no checkpoint"
  local left
  left=$("${RT[@]}" ps -aq --filter "label=impala.run")
  [[ -z $left ]] || die "containers left after stop: $left"
}

STEPS=(build docker-run two-learners frontend frontend-two-hosts)
(($# == 0)) || STEPS=("$@")
for step in "${STEPS[@]}"; do
  case $step in
    build | docker-run | two-learners | frontend | frontend-two-hosts) ;;
    *) die "no step $step: the steps are build docker-run two-learners frontend frontend-two-hosts" ;;
  esac
done
[[ -x .venv/bin/python ]] || die "run make setup first (the frontend runs from .venv here)"
choose_runtime
# Whatever step fails, no container of the check is left running.
trap 'remove impala-check-learner impala-check-learners impala-check-sshd \
  impala-check-actor-0 impala-check-actor-1' EXIT
RUNS=$(mktemp -d /tmp/impala-check.XXXXXX)
say "run folders: $RUNS"
for step in "${STEPS[@]}"; do
  case $step in
    build) build ;;
    docker-run) train_with_docker_run ;;
    two-learners) learners_across_containers ;;
    frontend) frontend_with_containers ;;
    frontend-two-hosts) frontend_learners_on_two_hosts ;;
  esac
done
say "all checks passed: ${STEPS[*]} ($IMAGE, ${RT[*]})"
