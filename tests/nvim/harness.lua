-- Shared by the scenario scripts: read the test's environment, load the plugin the way a
-- user does, wait with timeouts, and always write a JSON result before quitting.
local H = {}

H.out = {}
H.timeout = tonumber(os.getenv('KLSP_TIMEOUT_MS') or '60000')

function H.env(name)
  local v = os.getenv(name)
  assert(v and v ~= '', 'missing environment variable ' .. name)
  return v
end

function H.setup(extra)
  vim.cmd('filetype on') -- -u NONE leaves filetype detection off
  vim.opt.runtimepath:prepend(H.env('KLSP_PLUGIN'))
  vim.cmd('runtime plugin/kernel_lsp.lua')
  local opts = vim.tbl_deep_extend('force', {
    cmd = vim.json.decode(H.env('KLSP_CMD')),
    settings = vim.json.decode(os.getenv('KLSP_SETTINGS') or '{}'),
    progress = false,
  }, extra or {})
  local cmd_env = os.getenv('KLSP_CMD_ENV')
  if cmd_env and cmd_env ~= '' then
    -- The server's environment (the API key) through setup({ cmd_env = ... }), as the docs say.
    opts.cmd_env = vim.json.decode(cmd_env)
  end
  if os.getenv('KLSP_FORCE_FALLBACK') then
    -- Take the 0.8 - 0.10 path (FileType autocmd + vim.lsp.start) on this 0.11.
    vim.lsp.enable = nil
  end
  require('kernel_lsp').setup(opts)
end

--- Waits for `cond`; records `what` as a failure when it times out.
function H.wait(what, cond, timeout)
  local ok = vim.wait(timeout or H.timeout, cond, 50)
  if not ok then
    H.out.timeouts = H.out.timeouts or {}
    table.insert(H.out.timeouts, what)
  end
  return ok
end

function H.client(bufnr)
  return vim.lsp.get_clients({ name = 'kernel_lsp', bufnr = bufnr or 0 })[1]
end

function H.diagnostics(bufnr)
  local list = {}
  for _, d in ipairs(vim.diagnostic.get(bufnr or 0)) do
    table.insert(list, { lnum = d.lnum, col = d.col, severity = d.severity, message = d.message, source = d.source })
  end
  return list
end

function H.run(body)
  local ok, err = xpcall(body, debug.traceback)
  if not ok then
    H.out.error = tostring(err)
  end
  local f = assert(io.open(H.env('KLSP_OUT'), 'w'))
  f:write(vim.json.encode(H.out))
  f:close()
  -- Stop the server first so it does not outlive the editor.
  for _, c in ipairs(vim.lsp.get_clients()) do
    c:stop(true)
  end
  vim.cmd('qa!')
end

return H
