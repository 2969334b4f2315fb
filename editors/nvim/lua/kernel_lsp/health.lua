-- :checkhealth kernel_lsp — what kernel-lsp needs, checked the way the server will use it:
-- the server command and its version, its Python with torch (and a GPU), nvcc, and the
-- model endpoint (the API key is reported as set or not, never shown).
local M = {}

local h = vim.health

local function run(cmd, timeout)
  local ok, proc = pcall(vim.system, cmd, { text = true })
  if not ok then
    return nil, tostring(proc)
  end
  local res = proc:wait(timeout or 20000)
  if res.code ~= 0 then
    return nil, vim.trim((res.stderr or '') .. (res.stdout or ''))
  end
  return vim.trim(res.stdout or '')
end

--- The interpreter behind the server command: the command itself when it is a Python,
--- else the script's `#!` line.
local function server_python(cmd)
  local exe = vim.fn.exepath(cmd[1])
  if exe == '' then
    return nil
  end
  if vim.fs.basename(exe):match('^python') then
    return exe
  end
  local f = io.open(exe, 'r')
  local first = f and f:read('*l') or ''
  if f then
    f:close()
  end
  local shebang = first:match('^#!%s*(%S+)')
  if shebang and vim.fs.basename(shebang) == 'env' then
    shebang = vim.fn.exepath(first:match('^#!%s*%S+%s+(%S+)') or '')
  end
  return shebang ~= '' and shebang or nil
end

local PROBE = [[
import json, shutil
out = {}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda
    out["gpu"] = torch.cuda.is_available()
    out["gpu_name"] = torch.cuda.get_device_name(0) if out["gpu"] else None
except Exception as exc:
    out["torch_error"] = f"{type(exc).__name__}: {exc}"
try:
    import kernel_lsp
    out["kernel_lsp"] = kernel_lsp.__version__
except Exception as exc:
    out["kernel_lsp_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
]]

function M.check()
  local plugin = require('kernel_lsp')
  local cfg = plugin.lsp_config()
  local settings = (cfg.settings or {}).kernelLsp or {}
  local env = vim.tbl_extend('force', vim.fn.environ(), plugin.config.cmd_env or {})

  h.start('kernel-lsp server')
  local cmd = cfg.cmd or { 'kernel-lsp', 'serve' }
  if type(cmd) ~= 'table' or vim.fn.executable(cmd[1]) ~= 1 then
    h.error('server command not found: ' .. vim.inspect(cmd), {
      'pip install kernel-lsp into the Python that has torch, or set cmd in setup({ cmd = ... })' })
    return
  end
  h.ok('server command: ' .. table.concat(cmd, ' '))
  local serve_at = 0
  for i, part in ipairs(cmd) do
    if part == 'serve' then
      serve_at = i
    end
  end
  local version_cmd = vim.list_slice(cmd, 1, serve_at > 0 and serve_at - 1 or #cmd)
  table.insert(version_cmd, '--version')
  local version, err = run(version_cmd)
  if version then
    h.ok('server version: ' .. version)
  else
    h.error('`' .. table.concat(version_cmd, ' ') .. '` failed: ' .. (err or '?'))
  end
  for _, client in ipairs(vim.lsp.get_clients({ name = 'kernel_lsp' })) do
    local info = client.server_info or {}
    h.info(string.format('running server: %s %s (client %d)', info.name or '?', info.version or '?', client.id))
  end

  h.start('Python and torch')
  local python = settings.python or server_python(cmd)
  if not python then
    h.warn('could not tell which Python runs the server', { 'set settings.python to the interpreter with torch' })
  else
    local out, perr = run({ python, '-c', PROBE }, 60000)
    local probe = out and vim.json.decode(out) or nil
    if not probe then
      h.error(python .. ' did not answer: ' .. (perr or '?'))
    else
      h.ok('Python: ' .. python)
      if probe.kernel_lsp then
        h.ok('kernel_lsp ' .. probe.kernel_lsp .. ' importable there')
      else
        h.warn('kernel_lsp is not importable there: ' .. (probe.kernel_lsp_error or '?'))
      end
      if probe.torch then
        h.ok('torch ' .. probe.torch .. (probe.cuda_build ~= vim.NIL and probe.cuda_build and (' (CUDA ' .. probe.cuda_build .. ')') or ' (CPU build)'))
        h.start('GPU')
        if probe.gpu then
          h.ok('GPU: ' .. tostring(probe.gpu_name))
        else
          h.warn('no CUDA GPU visible to torch: compile checks work, CUDA kernels cannot be verified or timed',
            { 'PyTorch-only Tasks still run on the CPU' })
        end
      else
        h.error('torch is not importable: ' .. (probe.torch_error or '?'),
          { 'install torch into ' .. python .. ': the Worker runs every harness there' })
      end
    end
  end

  h.start('nvcc')
  local nvcc = settings.nvcc or 'nvcc'
  if vim.fn.executable(nvcc) ~= 1 and env.CUDA_HOME then
    nvcc = env.CUDA_HOME .. '/bin/nvcc'
  end
  if vim.fn.executable(nvcc) == 1 then
    local text = run({ nvcc, '--version' }) or ''
    local release = text:match('release ([%d%.]+)') or '?'
    h.ok('nvcc ' .. release .. ': ' .. vim.fn.exepath(nvcc))
  else
    h.error('nvcc not found', { 'put the CUDA toolkit on PATH, set CUDA_HOME, or settings.nvcc' })
  end

  h.start('model endpoint (Optimize with an LLM)')
  local agent = settings.agent or {}
  local model = agent.model or env.KERNEL_LSP_MODEL
  local base = agent.baseUrl or env.OPENAI_BASE_URL
  if model then
    h.ok('model: ' .. model)
  else
    h.warn('no model configured: Optimize uses the tuner (no LLM)', { 'set settings.agent.model and agent.baseUrl' })
  end
  h.info('endpoint: ' .. (base or 'the OpenAI default'))
  if env.OPENAI_API_KEY and env.OPENAI_API_KEY ~= '' then
    h.ok('OPENAI_API_KEY is set (not shown)')
  elseif model then
    h.warn('OPENAI_API_KEY is not set in the server environment', { 'setup({ cmd_env = { OPENAI_API_KEY = ... } })' })
  end

  h.start('where candidates run')
  if (settings.executor or 'local') ~= 'ray' then
    h.ok('on this machine (executor "local"; for a GPU box see :help kernel_lsp-ray)')
    return
  end
  local address = settings.rayAddress
  h.info('Ray cluster: ' .. (address or 'ray_address from [tool.kernel-lsp], else auto'))
  if address and not address:find('^ray://') and address ~= 'auto' then
    h.warn('from an editor use the Ray Client port: Ray may end a host:port driver when the head goes away',
      { 'settings.rayAddress = "ray://HOST:10001"' })
  end
  if env.RAY_AUTH_TOKEN and env.RAY_AUTH_TOKEN ~= '' then
    h.ok('RAY_AUTH_TOKEN is set (not shown)')
  else
    h.warn('RAY_AUTH_TOKEN is not set in the server environment: a cluster with token auth refuses it',
      { "setup({ cmd_env = { RAY_AUTH_MODE = 'token', RAY_AUTH_TOKEN = ... } }) (the box's ~/.ray/auth_token)" })
  end
  local c = plugin.state.cluster
  if type(c) ~= 'table' then
    h.info('no cluster state from the server yet (open a .cu or .py file)')
  elseif c.state == 'connected' then
    h.ok(string.format('connected: %s', c.message or (tostring(c.gpus) .. ' GPU actor(s)')))
  else
    h.warn(string.format('%s: %s', c.state or '?', c.message or ''),
      { 'evaluations run on this machine meanwhile; check the address, the token and that the head runs' })
  end
end

return M
