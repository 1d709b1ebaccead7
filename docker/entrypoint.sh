#!/usr/bin/env bash
# The image's entry point. The role is the command:
#   (nothing), help          what the image runs and how (this text)
#   sshd PORT DIR            an SSH server for the first learner's mpirun (see docker/README.md)
#   python experiment.py ... any other command runs as given, in /opt/impala, with the
#   run_experiment_mm_raw.py  project's virtual environment first on PATH
set -euo pipefail

# A container may run under any uid (`docker run --user "$(id -u):$(id -g)"`, so that files in
# the run folder belong to the user who owns it on the host). mpirun and sshd need that uid to
# have a name: nss_wrapper gives it one (u<uid>, the same on every host for the same uid), from
# a copy of /etc/passwd with a line added.
if ! whoami >/dev/null 2>&1; then
  passwd=$(mktemp /tmp/passwd.XXXXXX)
  cat /etc/passwd >"$passwd"
  printf 'u%s:x:%s:%s::/tmp:/bin/bash\n' "$(id -u)" "$(id -u)" "$(id -g)" >>"$passwd"
  export NSS_WRAPPER_PASSWD=$passwd NSS_WRAPPER_GROUP=/etc/group
  export LD_PRELOAD=libnss_wrapper.so${LD_PRELOAD:+:$LD_PRELOAD}
fi
[[ -n ${HOME:-} && -w $HOME ]] || export HOME=/tmp

usage() {
  cat <<'TEXT'
impala-horovod image: every role of a run, chosen by the command.

  a learner alone (several: under mpirun, one rank each; ranks on other hosts need `sshd`):
    python -u experiment.py --job_name=learner --learner_hosts=HOST:PORT \
        --actor_hosts=A,B --experiment=NAME
  an actor:
    python -u experiment.py --job_name=actor --task=0 --learner_hosts=HOST:PORT \
        --actor_hosts=A,B --experiment=NAME
  play a trained run (and record videos):
    python experiment.py --mode=test --experiment=NAME --record_video
  the multi-host frontend:     python run_experiment_mm_raw.py --workers_csv_path=...
  an SSH server for mpirun:    sshd PORT DIR   (DIR holds host_key and authorized_keys)
  every flag:                  python experiment.py --helpfull

Run folders are in /opt/impala/runs: mount yours there (-v "$PWD/runs:/opt/impala/runs"),
and use host networking (--network=host). docker/README.md in the repository has the full recipes.
TEXT
}

sshd_role() {  # sshd PORT DIR: the user's own sshd, key login as this user only, no forwarding
  local port=${1:?sshd needs a PORT} dir=${2:?sshd needs a DIR with host_key and authorized_keys}
  [[ $port =~ ^[0-9]+$ ]] && ((port >= 1 && port <= 65535)) || {
    echo "sshd: PORT=$port: not a port in 1-65535" >&2; exit 2; }
  local key
  for key in "$dir/host_key" "$dir/authorized_keys"; do
    [[ -f $key ]] || { echo "sshd: $key: no such file" >&2; exit 2; }
    [[ -z $(find "$key" -perm /022) ]] || {
      echo "sshd: $key: others may write it (chmod 600 it)" >&2; exit 2; }
  done
  exec /usr/sbin/sshd -D -e -f /dev/null -p "$port" -h "$dir/host_key" \
    -o AuthorizedKeysFile="$dir/authorized_keys" -o PasswordAuthentication=no \
    -o KbdInteractiveAuthentication=no -o PermitRootLogin=prohibit-password -o UsePAM=no \
    -o AllowUsers="$(id -un)" -o PidFile=none -o StrictModes=no -o PermitUserEnvironment=no \
    -o DisableForwarding=yes -o PermitTunnel=no -o PrintMotd=no
}

case ${1:-help} in
  help | -h | --help) usage ;;
  sshd) shift; sshd_role "$@" ;;
  *) exec "$@" ;;
esac
