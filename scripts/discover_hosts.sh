#!/bin/sh
# Host discovery for elastic training: prints the hosts of FILE, one
# "host:slots" per line, leaving out blank lines and # comments.
#
#   horovodrun --gloo -np 2 --min-np 1 --max-np 2 \
#       --host-discovery-script "scripts/discover_hosts.sh hosts.txt" ...
#
# horovodrun runs it every second. Edit FILE while the job runs: a host taken
# out is stopped and the others go on; a host put in joins at the next commit.
if [ $# -ne 1 ] || [ ! -r "$1" ]; then
    echo "usage: $0 FILE (a readable file of host:slots lines)" >&2
    exit 2
fi
grep -v -e '^[[:space:]]*#' -e '^[[:space:]]*$' "$1"
