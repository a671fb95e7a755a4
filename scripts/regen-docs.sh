#!/usr/bin/env bash
# Regenerates the pictures README.md and docs/ show, with the tool itself, so they cannot drift from what it
# draws (figures quoted in prose are checked by tests/project/test_docs_commands.py's `<!-- output: ... -->` markers).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_python.sh
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
hetauto plan -o "$tmp/paper-4c.json" --plot docs/img/paper-4c-plan.png   # README: the default scenario's plan
echo "regenerated: docs/img/paper-4c-plan.png"
