#!/bin/sh
# A planned recreation of the MCP server behind holdfast (deploy/traefik/compose.yaml, or
# compose.holdfast-in-front.yaml): nothing fails, nothing runs twice.
#
#   deploy/traefik/deploy.sh                  # after `docker compose pull` or `build` of mcp
#   COMPOSE_FILE=deploy/traefik/compose.holdfast-in-front.yaml DRAIN_SECS=10 deploy/traefik/deploy.sh
#
# 1. `holdfast pause`: new calls are held in holdfast before they are sent; the calls in
#    flight finish on the old instance (up to DRAIN_SECS). Exit 3: only clients' standalone GET
#    streams were still open then, which carry no call: the deploy goes on, and each stream's
#    reconnect is held like any other request. Exit 4: calls were still in flight (a long tool
#    call): recreating now would cut them, so nothing is recreated and holdfast resumes.
# 2. The MCP server is recreated; `--wait` returns once it runs (or is healthy, if it has a
#    healthcheck).
# 3. `holdfast resume`: the held calls go to the new instance, oldest first, each once. holdfast
#    would also resume by itself once it sees the new instance answer, or after pause.max_secs.
#
# Exit status: 0 deployed; 1 holdfast could not be paused, or calls were still in flight after
# DRAIN_SECS (nothing was recreated; try again, or with a longer DRAIN_SECS), or the recreation
# failed (holdfast was resumed, so held calls go wherever the server is now).
set -eu

here=$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)
compose_file=${COMPOSE_FILE:-$here/compose.yaml}
service=${SERVICE:-mcp}
drain=${DRAIN_SECS:-20}

compose() { docker compose -f "$compose_file" "$@"; }
# holdfast's own binary in its container; its admin listener is on the container's loopback,
# which pause and resume may use without a token.
holdfast() { compose exec -T holdfast /usr/local/bin/holdfast "$@"; }

status=0
holdfast pause --drain-timeout "$drain" || status=$?
case $status in
0) ;;
3) echo "deploy: only GET streams still open after ${drain} s (above); going on" >&2 ;;
4)
    echo "deploy: calls still in flight after ${drain} s (above); nothing was recreated" >&2
    holdfast resume || true
    exit 1
    ;;
*)
    echo "deploy: holdfast could not pause (exit $status); nothing was recreated" >&2
    exit 1
    ;;
esac

if ! compose up -d --force-recreate --wait "$service"; then
    echo "deploy: recreating $service failed; resuming holdfast" >&2
    holdfast resume || true
    exit 1
fi
holdfast resume
