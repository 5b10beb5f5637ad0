#!/usr/bin/env sh
# Installs the browser test's driver (playwright-core, which downloads no browser) into
# tests/observability/browser/node_modules. The browser is Debian's chromium (/usr/bin/chromium),
# installed by .ci/run. Then tests/observability/test_dashboard_browser.py runs `node dashboard.mjs`.
set -eu
cd "$(dirname "$0")"
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund
else
  npm install --no-audit --no-fund
fi
