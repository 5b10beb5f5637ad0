#!/usr/bin/env sh
# Installs the modeler-side check's tooling (bpmn-moddle, camunda-bpmn-moddle, bpmnlint) into
# tests/processes/modeler/node_modules. CI runs this before pytest; then
# tests/processes/test_modeler_lint.py runs `node check.mjs` (set INFERLB_REQUIRE_MODELER_LINT=1 in CI
# so a missing node or a skipped install fails instead of skipping).
set -eu
cd "$(dirname "$0")"
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund
else
  npm install --no-audit --no-fund
fi
