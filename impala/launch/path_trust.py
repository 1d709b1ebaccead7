"""Shell functions that tell whether a path on a host is no one else's to change.

The frontend asks this of a host before it runs anything there (the row's workdir, its
`experiment.py` and its python: `run_control._check_worker_command`) and before it writes a
file there over SSH (`hosts.SshHost.write_file`). Both run the same functions, so what one
check catches the other does too; on this machine `run_folder.unsafe_folder` does the same in
Python.

The caller defines `untrusted WHAT REASON`, which says why in one line and exits non-zero:
each use words its refusal its own way. Then:

- `chain WHAT P STRICT`: P and every folder above it are this user's or root's; none is
  writable by others unless sticky (as /tmp: others cannot rename what is ours there), and the
  first STRICT of them (P, its folder, ...) not writable by others at all. A link is only
  checked for its owner (its mode means nothing). A part that does not exist is refused: it
  may be another user's folder renamed away for the moment of the check.
- `walk WHAT P`: resolves P part by part as the kernel does into `$cur` (a path without links),
  checking every link met (`chain` of the link: another user's link, or one in a folder others
  can write to, could be pointed elsewhere) and every folder a '..' leaves.
- `trusted WHAT PATH STRICT`: PATH (absolute, without '.' or '..' parts) resolved by `walk`,
  its real path checked by `chain`, and each of the last STRICT parts of PATH as given,
  resolved, held strict too.

Group-writable paths are the group's trust, as for the run folder; ACLs are not read.
"""

from __future__ import annotations

import shlex

TRUST_FUNCTIONS = (
    "me=$(id -u) && "
    'ours() { [ -n "$(find "$1" -maxdepth 0 \\( -user "$me" -o -user 0 \\) -print)" ]; } && '
    'open_to_all() { [ -n "$(find "$1" -maxdepth 0 -perm -0002 -print)" ]; } && '
    'sticky() { [ -n "$(find "$1" -maxdepth 0 -perm -1000 -print)" ]; } && '
    'exists() { [ -e "$1" ] || [ -L "$1" ]; } && '
    "chain() { p=$2; strict=$3; while :; do "
    'exists "$p" || untrusted "$1" "$p does not exist"; '
    'ours "$p" || untrusted "$1" "$p is another user\'s"; '
    'if [ ! -L "$p" ] && open_to_all "$p"; then '
    '[ "$strict" -gt 0 ] && untrusted "$1" "$p is writable by others"; '
    'sticky "$p" || untrusted "$1" "$p is writable by others and not sticky"; fi; '
    'strict=$((strict - 1)); [ "$p" = / ] && break; p=${p%/*}; [ -n "$p" ] || p=/; done; } && '
    'walk() { cur=; rest=$2; hops=0; while :; do rest=${rest#/}; [ -n "$rest" ] || break; '
    "case $rest in */*) part=${rest%%/*}; rest=/${rest#*/} ;; *) part=$rest; rest= ;; esac; "
    # A '..' leaves a folder that the path went through: it must be trusted too (another
    # user's folder there could be made a link, and the '..' lead elsewhere).
    'case $part in \'\' | .) continue ;; ..) [ -z "$cur" ] || chain "$1" "$cur" 0; '
    "cur=${cur%/*}; continue ;; esac; "
    'next=$cur/$part; if [ -L "$next" ]; then chain "$1" "$next" 1; '
    'hops=$((hops + 1)); [ "$hops" -le 40 ] || untrusted "$1" "$2 leads through too many links"; '
    # A target may end in a line break, which $(...) would drop: a '.' after it, cut off.
    't=$(readlink -- "$next" && echo .) || untrusted "$1" "$next cannot be read"; t=${t%?.}; '
    "case $t in /*) cur= ;; esac; rest=/$t$rest; "
    'else cur=$next; fi; done; [ -n "$cur" ] || cur=/; } && '
    'trusted() { walk "$1" "$2"; chain "$1" "$cur" "$3"; q=$2; n=$3; '
    'while [ "$n" -gt 1 ]; do n=$((n - 1)); q=${q%/*}; [ -n "$q" ] || q=/; '
    'walk "$1" "$q"; chain "$1" "$cur" 1; done; }'
)


def untrusted_function(prefix: str, suffix: str = "") -> str:
    """Shell: an `untrusted WHAT REASON` that prints `<prefix>REASON<suffix>` to standard error
    (WHAT too when `prefix` is empty: `WHAT: REASON`) and exits 3."""
    said = f"{shlex.quote(prefix)}" if prefix else '"$1: "'
    return f"untrusted() {{ printf '%s\\n' {said}\"$2\"{shlex.quote(suffix)} >&2; exit 3; }}"
