#!/usr/bin/env bash
# Sourced by .ci/run: installs Debian's chromium and chromium-driver if they are missing, starts
# Chromium headless once to see that it runs (no sandbox, GPU or network; a throwaway profile),
# and exports CHARLM_TEST_CHROMIUM and CHARLM_TEST_CHROMEDRIVER for tests/integration/test_page.py,
# which drives its own Chromium through selenium. Without root it says so and the page test is
# skipped; a Chromium that is installed but does not start fails that test, with the log here.
charlm_chromium_start() {
  local chromium=/usr/bin/chromium driver=/usr/bin/chromedriver dir
  if [ ! -x "$chromium" ] || [ ! -x "$driver" ]; then
    if [ "$(id -u)" != 0 ]; then
      echo "chromium: not installed and not root: the page test is skipped"; return 0
    fi
    echo "chromium: installing Debian's chromium and chromium-driver"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq chromium chromium-driver >/dev/null ||
      { echo "chromium: install failed: the page test is skipped"; return 0; }
  fi
  export CHARLM_TEST_CHROMIUM="$chromium" CHARLM_TEST_CHROMEDRIVER="$driver"
  dir="$(mktemp -d /tmp/charlm-chromium.XXXXXX)"
  if timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
      --disable-background-networking --disable-component-update --disable-sync \
      --user-data-dir="$dir/profile" --dump-dom 'data:text/html,<p>ok</p>' >"$dir/dom" \
      2>"$dir/log" && grep -q '<p>ok</p>' "$dir/dom"; then
    echo "chromium: $("$chromium" --version 2>/dev/null), $("$driver" --version | cut -d' ' -f1-2)"
    rm -rf "$dir"
  else
    echo "chromium: does not start (the page test will fail); its log, $dir/log, ends:"
    tail -5 "$dir/log"
  fi
}
charlm_chromium_start
