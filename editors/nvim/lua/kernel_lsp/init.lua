-- kernel-lsp for Neovim: setup, user commands, progress, status, and the candidate
-- diff that must come before applyCandidate (Neovim applies workspace edits unasked).
local M = {}

local NAME = 'kernel_lsp'
local CANDIDATE_DIR = '/.kernel-lsp/candidates/'

M.config = {
  cmd = nil, -- default from lsp/kernel_lsp.lua: { 'kernel-lsp', 'serve' }
  filetypes = nil,
  root_markers = nil,
  cmd_env = nil, -- e.g. { OPENAI_API_KEY = os.getenv('MY_KEY') }; never put keys in settings
  settings = {}, -- kernelLsp settings: nvcc, arch, extraFlags, ... (see :help kernel_lsp-settings)
  progress = true, -- echo workDoneProgress of kernel-lsp jobs
  codelens = true, -- keep code lenses (measured numbers, Benchmark, Optimize) up to date
  inlay_hints = true, -- registers, spills and occupancy after kernel names
  -- How to ask before applying a candidate: function(prompt, callback(apply: boolean)).
  confirm = nil,
}

-- What the plugin saw; tests and statuslines read it.
M.state = {
  jobs = {}, -- from kernel-lsp/status
  documents = {}, -- uri -> the server's measurement of that document (kernel-lsp/status)
  cluster = nil, -- the Ray cluster the server evaluates on (kernel-lsp/status; nil: this machine)
  candidate = nil, -- the last verified candidate offered (kernel-lsp/candidate): its gain in words
  messages = {}, -- every server message in full (a long one is echoed cut: no hit-enter prompt)
  progress = {}, -- recent kernel-lsp progress values
  last_uri = nil, -- document of the last command
  last_preview = nil, -- { search =, candidate = } of the last search / preview
  diff = nil, -- { orig_win =, cand_win =, cand_buf = } while a candidate diff is open
}

local has_011 = vim.fn.has('nvim-0.11') == 1

--- One line that fits the command line: a longer echo stops Neovim at "Press ENTER".
function M.fit(line, width)
  line = (line or ''):gsub('%s*\n%s*', ' ')
  if width and width > 1 and vim.fn.strdisplaywidth(line) > width then
    local cut = vim.fn.strcharpart(line, 0, width - 1)
    while vim.fn.strdisplaywidth(cut) > width - 1 do
      cut = vim.fn.strcharpart(cut, 0, vim.fn.strchars(cut) - 1)
    end
    line = cut .. '…'
  end
  return line
end

local function notify(msg, level)
  msg = msg:gsub('^kernel%-lsp: ', '')
  table.insert(M.state.messages, msg)
  if #M.state.messages > 200 then
    table.remove(M.state.messages, 1)
  end
  local width = #vim.api.nvim_list_uis() > 0 and vim.v.echospace or nil
  vim.notify(M.fit('kernel-lsp: ' .. msg, width), level or vim.log.levels.INFO)
end

local function get_clients(filter)
  if vim.lsp.get_clients then
    return vim.lsp.get_clients(filter)
  end
  return vim.lsp.get_active_clients(filter) -- 0.8 - 0.9
end

--- The kernel-lsp client of a buffer (or any kernel-lsp client).
function M.client(bufnr)
  return get_clients({ name = NAME, bufnr = bufnr })[1] or get_clients({ name = NAME })[1]
end

local function request(client, method, params, handler, bufnr)
  if has_011 then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

local function request_sync(client, method, params, timeout, bufnr)
  if has_011 then
    return client:request_sync(method, params, timeout, bufnr)
  end
  return client.request_sync(method, params, timeout, bufnr)
end

function M.is_candidate(uri_or_path)
  return (uri_or_path or ''):gsub('\\', '/'):find(CANDIDATE_DIR, 1, true) ~= nil
end

--- Search and candidate ids from `.kernel-lsp/candidates/<search>/<candidate>/<file>`.
function M.ref_from_path(path)
  local p = path:gsub('\\', '/')
  local _, e = p:find(CANDIDATE_DIR, 1, true)
  if not e then
    return {}
  end
  local parts = vim.split(p:sub(e + 1), '/', { plain = true })
  table.remove(parts) -- the file name
  return { search = parts[1], candidate = parts[2] }
end

local function remember(command, arg)
  if type(arg) ~= 'table' then
    return
  end
  if type(arg.uri) == 'string' and not M.is_candidate(arg.uri) then
    M.state.last_uri = arg.uri
  end
  if command == 'kernel-lsp.previewCandidate' or command == 'kernel-lsp.applyCandidate' then
    M.state.last_preview = { search = arg.search, candidate = arg.candidate }
  elseif command == 'kernel-lsp.optimize' or command == 'kernel-lsp.tune' or command == 'kernel-lsp.writeKernels' then
    M.state.last_preview = nil -- a new search: ids of the last one would apply the wrong result
  end
end

--- Ids of a search from a command result ({search, best} from optimize/tune).
local function remember_result(result)
  if type(result) == 'table' and result.search ~= nil and result.search ~= vim.NIL then
    local cand = result.candidate or result.best
    M.state.last_preview = { search = result.search, candidate = cand ~= vim.NIL and cand or nil }
  end
end

--- workspace/executeCommand on the kernel-lsp server; `on_result(err, result)` optional.
function M.exec(command, arg, bufnr, on_result)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    notify('no kernel-lsp server is attached (see :checkhealth vim.lsp)', vim.log.levels.WARN)
    return false
  end
  remember(command, arg)
  request(client, 'workspace/executeCommand', { command = command, arguments = { arg } }, function(err, result)
    if err then
      notify(command .. ': ' .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
    else
      remember_result(result)
    end
    if on_result then
      on_result(err, result)
    end
  end, bufnr)
  return true
end

local function contains(range, line, col)
  local s, e = range.start, range['end']
  if line < s.line or line > e.line then
    return false
  end
  if line == s.line and col < s.character then
    return false
  end
  return not (line == e.line and col > e.character)
end

--- Name of the innermost document symbol (a Target) under the cursor, if any.
function M.target_at_cursor(bufnr, timeout)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    return nil
  end
  local params = { textDocument = vim.lsp.util.make_text_document_params(bufnr) }
  local resp = request_sync(client, 'textDocument/documentSymbol', params, timeout or 2000, bufnr)
  if not resp or resp.err or type(resp.result) ~= 'table' then
    return nil
  end
  local cursor = vim.api.nvim_win_get_cursor(0)
  local line, col = cursor[1] - 1, cursor[2]
  local best
  local function visit(symbols)
    for _, s in ipairs(symbols or {}) do
      local range = s.range or (s.location and s.location.range)
      if range and contains(range, line, col) then
        best = s.name
        visit(s.children)
      end
    end
  end
  visit(resp.result)
  return best
end

--- {uri} of the current buffer: a document has one Task, which the server finds itself.
function M.document_args(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  return { uri = vim.uri_from_bufnr(bufnr) }
end

local function num(v)
  return type(v) == 'number' and v or nil
end

--- One line for a benchmark result (an Evaluation summary); nil when there is nothing to say.
function M.benchmark_summary(r)
  if type(r) ~= 'table' then
    return nil
  end
  local parts = { (r.target ~= vim.NIL and r.target or 'kernel') .. ': ' .. tostring(r.verdict ~= vim.NIL and r.verdict or '?') }
  if num(r.time_ms) then
    table.insert(parts, string.format('%.3f ms', r.time_ms))
  end
  if num(r.speedup_eager) then
    table.insert(parts, string.format('%.2fx vs eager', r.speedup_eager))
  end
  if num(r.speedup_compile) then
    table.insert(parts, string.format('%.2fx vs torch.compile', r.speedup_compile))
  end
  if num(r.spread_pct) then
    table.insert(parts, string.format('±%.1f%%', r.spread_pct))
  end
  local why = type(r.reason) == 'string' and r.reason or (type(r.message) == 'string' and r.message or '')
  if why ~= '' then
    table.insert(parts, why)
  end
  return table.concat(parts, ' · ')
end

-- Optimize and Tune report through progress, window/showMessage and the diff: no echo here.
local function document_command(server_command, extra, on_result)
  return function(opts)
    local arg = M.document_args()
    for k, v in pairs(extra and extra(opts) or {}) do
      arg[k] = v
    end
    M.exec(server_command, arg, nil, on_result)
  end
end

-- stylua: ignore
local COMMANDS = {
  KernelLspOptimize = { document_command('kernel-lsp.optimize', function(o)
    return o.args ~= '' and { proposer = o.args } or {}
  end), { nargs = '?', complete = function() return { 'llm', 'tuner' } end,
           desc = 'kernel-lsp: optimize the kernel under the cursor [llm|tuner]' } },
  KernelLspTune = { document_command('kernel-lsp.tune'), { desc = 'kernel-lsp: tune (no LLM)' } },
  KernelLspWriteKernels = { document_command('kernel-lsp.writeKernels'),
                            { desc = "kernel-lsp: write this module's kernels from torch.compile (no LLM)" } },
  KernelLspBenchmark = { document_command('kernel-lsp.benchmark', nil, function(err, result)
    -- A run that did nothing: the server says why itself (window/showMessage); not twice.
    if err or type(result) ~= 'table' or result.error then return end
    local text = M.benchmark_summary(result)
    if text then notify(text) end
  end), { desc = 'kernel-lsp: verify and time' } },
  KernelLspCancel = { function(o)
    local job = o.args ~= '' and o.args or (#M.state.jobs == 1 and M.state.jobs[1].id or nil)
    M.exec('kernel-lsp.cancel', job and { job = job } or vim.empty_dict(), nil, function(err, result)
      if not err and type(result) == 'table' and type(result.cancelled) == 'number' then
        notify(result.cancelled == 0 and 'no job to cancel' or ('cancelled ' .. result.cancelled .. ' job(s)'))
      end
    end)
  end, { nargs = '?', desc = 'kernel-lsp: cancel a job (all when several run)' } },
  KernelLspReport = { function(o)
    local search = o.args ~= '' and o.args or (M.state.last_preview or {}).search
    M.exec('kernel-lsp.showReport', search and { search = search } or vim.empty_dict(), nil, function(err, result)
      -- The server opens it itself (window/showDocument, external); say where it is.
      local path = type(result) == 'table' and result.path or result
      if not err and type(path) == 'string' then
        notify('report: ' .. path)
      end
    end)
  end, { nargs = '?', desc = 'kernel-lsp: write and open the HTML report' } },
  KernelLspApply = { function()
    M.apply(M.state.last_preview or {})
  end, { desc = 'kernel-lsp: apply the last previewed candidate' } },
  KernelLspMessages = { function()
    vim.cmd('new')
    vim.bo.buftype, vim.bo.bufhidden, vim.bo.swapfile = 'nofile', 'wipe', false
    vim.api.nvim_buf_set_lines(0, 0, -1, false, #M.state.messages > 0 and M.state.messages or { '(no kernel-lsp messages)' })
  end, { desc = 'kernel-lsp: every server message in full' } },
}

function M.create_commands()
  for name, spec in pairs(COMMANDS) do
    vim.api.nvim_create_user_command(name, spec[1], spec[2])
  end
end

-- kernel-lsp/status -------------------------------------------------------------------

--- The Ray cluster in a few words ('ray 2 GPUs', 'ray lost', ...); nil with the local Executor.
function M.cluster_words(c)
  if type(c) ~= 'table' or c.executor ~= 'ray' then
    return nil
  end
  if c.state == 'connected' then
    local n = type(c.gpus) == 'number' and c.gpus or 0
    return string.format('ray %d GPU%s', n, n == 1 and '' or 's')
  elseif c.state == 'connecting' or c.state == 'lost' then
    return 'ray ' .. c.state
  end
  return 'ray unreachable'
end

--- A short statusline string: '' when idle with nothing to say.
function M.statusline()
  local line = M.jobs_statusline()
  local cluster = M.cluster_words(M.state.cluster)
  if not cluster then
    return line
  end
  return line == '' and ('kernel-lsp ' .. cluster) or (line .. ' · ' .. cluster)
end

function M.jobs_statusline()
  local jobs = M.state.jobs
  local function x(v)
    return type(v) == 'number' and string.format('%.2fx', v) or nil
  end
  if #jobs == 0 then
    -- The measurement of the current file, in the lens' words (never a Search's unconfirmed best).
    local doc = M.state.documents[vim.uri_from_bufnr(0)]
    return doc and type(doc.summary) == 'string' and ('kernel-lsp ' .. doc.summary) or ''
  end
  local best
  for _, j in ipairs(jobs) do
    if type(j.bestSpeedup) == 'number' and (not best or j.bestSpeedup > best) then
      best = j.bestSpeedup
    end
  end
  local label = #jobs == 1 and ((jobs[1].title or 'job') .. (jobs[1].message and jobs[1].message ~= '' and (': ' .. jobs[1].message) or ''))
    or (#jobs .. ' jobs')
  -- The server's own job message may already say `best 1.42x`: say it once.
  local say_best = best and not label:find('best %d') and (' · best ' .. x(best)) or ''
  return 'kernel-lsp ' .. label .. say_best
end

--- Re-ask the server for the lenses of every buffer it serves (Neovim has no handler for
--- workspace/codeLens/refresh: the status notification that follows each measurement is ours).
function M.refresh_lenses()
  if not M.config.codelens or not (vim.lsp.codelens and vim.lsp.codelens.refresh) then
    return
  end
  for _, client in ipairs(get_clients({ name = NAME })) do
    for bufnr in pairs(client.attached_buffers or {}) do
      if vim.api.nvim_buf_is_loaded(bufnr) then
        pcall(vim.lsp.codelens.refresh, { bufnr = bufnr })
      end
    end
  end
end

function M.on_status(_, params, _, _)
  M.state.jobs = type(params) == 'table' and type(params.jobs) == 'table' and params.jobs or {}
  -- JSON null arrives as vim.NIL: only a table is a cluster.
  M.state.cluster = type(params) == 'table' and type(params.cluster) == 'table' and params.cluster or nil
  M.state.documents = {}
  for _, d in ipairs(type(params) == 'table' and type(params.documents) == 'table' and params.documents or {}) do
    if type(d.uri) == 'string' then
      M.state.documents[d.uri] = d
    end
  end
  for _, j in ipairs(M.state.jobs) do
    -- Jobs started from code actions bypass M.exec: their uri tells which file a preview is for.
    if type(j.uri) == 'string' and not M.is_candidate(j.uri) then
      M.state.last_uri = j.uri
    end
  end
  vim.g.kernel_lsp_status = M.statusline()
  vim.api.nvim_exec_autocmds('User', { pattern = 'KernelLspStatus', modeline = false })
  vim.cmd('redrawstatus')
  vim.schedule(M.refresh_lenses)
end

--- kernel-lsp/candidate: a verified candidate is about to be shown; its gain goes in the prompt.
function M.on_candidate(_, params, _, _)
  if type(params) == 'table' then
    M.state.candidate = params
  end
end

--- window/showMessage: one line that fits (the full text stays in :KernelLspMessages).
function M.on_show_message(_, params, _, _)
  if type(params) == 'table' and type(params.message) == 'string' then
    local levels = { vim.log.levels.ERROR, vim.log.levels.WARN, vim.log.levels.INFO, vim.log.levels.DEBUG }
    notify(params.message, levels[params.type] or vim.log.levels.INFO)
  end
  return vim.NIL
end

-- Progress ----------------------------------------------------------------------------

--- The echoed progress line, cut to `width` columns: a longer echo would stop the editor
--- with a hit-enter prompt in the middle of a search.
function M.progress_line(value, width)
  local pct = value.percentage and string.format(' (%d%%)', value.percentage) or ''
  return M.fit('kernel-lsp ' .. (value.title or '') .. (value.message and (': ' .. value.message) or '') .. pct, width)
end

local function on_progress(client_id, value)
  local client = vim.lsp.get_client_by_id(client_id)
  if not client or client.name ~= NAME or type(value) ~= 'table' then
    return
  end
  table.insert(M.state.progress, value)
  if #M.state.progress > 100 then
    table.remove(M.state.progress, 1)
  end
  if not M.config.progress then
    return
  end
  -- Echoed, not kept: the outcome that matters also comes as a message or a lens, once.
  vim.api.nvim_echo({ { M.progress_line(value, vim.v.echospace) } }, false, {})
  if value.kind == 'end' then
    vim.schedule(M.refresh_lenses)
  end
end

local function watch_progress(group)
  if vim.fn.has('nvim-0.10') == 1 then
    vim.api.nvim_create_autocmd('LspProgress', {
      group = group,
      callback = function(ev)
        local data = ev.data or {}
        on_progress(data.client_id, data.params and data.params.value)
      end,
    })
  else -- 0.8 - 0.9: no data on the event; read the client's progress table
    vim.api.nvim_create_autocmd('User', {
      group = group,
      pattern = 'LspProgressUpdate',
      callback = function()
        for _, client in ipairs(get_clients({ name = NAME })) do
          for _, p in pairs(client.messages and client.messages.progress or {}) do
            on_progress(client.id, { kind = p.done and 'end' or 'report', title = p.title, message = p.message, percentage = p.percentage })
          end
        end
      end,
    })
  end
end

-- The candidate diff --------------------------------------------------------------------

--- Whether a candidate file name stands for `name`: `softmax.cu` or `softmax-<id>.cu`.
function M.same_file(candidate_name, name)
  if candidate_name == name then
    return true
  end
  local stem, ext = name:match('^(.*)(%.[^.]+)$')
  if not stem then
    return false
  end
  return candidate_name:sub(1, #stem + 1) == stem .. '-' and candidate_name:sub(-#ext) == ext
end

local function find_original(candidate_path)
  if M.state.last_uri then
    return vim.uri_to_fname(M.state.last_uri)
  end
  local name = vim.fs.basename(candidate_path)
  for _, b in ipairs(vim.api.nvim_list_bufs()) do
    local p = vim.api.nvim_buf_get_name(b)
    if p ~= '' and not M.is_candidate(p) and M.same_file(name, vim.fs.basename(p)) then
      return p
    end
  end
end

function M.close_diff()
  local d = M.state.diff
  M.state.diff = nil
  if not d then
    return
  end
  if vim.api.nvim_win_is_valid(d.cand_win) then
    vim.api.nvim_win_close(d.cand_win, true)
  end
  if vim.api.nvim_win_is_valid(d.orig_win) then
    vim.api.nvim_win_call(d.orig_win, function()
      vim.cmd('diffoff')
    end)
  end
end

--- kernel-lsp.applyCandidate; the server sends the versioned edit as workspace/applyEdit.
function M.apply(ref, on_done)
  local arg = {}
  arg.search = ref.search
  arg.candidate = ref.candidate
  local bufnr = M.state.last_uri and vim.uri_to_bufnr(M.state.last_uri) or nil
  return M.exec('kernel-lsp.applyCandidate', next(arg) and arg or vim.empty_dict(), bufnr, function(err, result)
    M.close_diff()
    if not err then
      local applied = type(result) == 'table' and result.applied
      if applied == false then
        notify('not applied' .. (type(result.reason) == 'string' and (': ' .. result.reason) or ''), vim.log.levels.WARN)
      else
        notify('candidate applied')
      end
    end
    if on_done then
      on_done(err, result)
    end
  end)
end

--- "Apply this verified candidate to rowsum.py? 2.31x faster than your code, verified ·
--- 5.20x PyTorch eager · 0.61x torch.compile · …" (the server's words, both baselines).
function M.apply_prompt(name)
  local c = M.state.candidate
  local gain = type(c) == 'table' and type(c.gain) == 'string' and c.gain ~= '' and (' ' .. c.gain) or ''
  return 'kernel-lsp: apply this verified candidate to ' .. name .. '?' .. gain
end

local function default_confirm(prompt, callback)
  vim.ui.select({ 'Apply', 'Discard' }, { prompt = prompt }, function(choice)
    callback(choice == 'Apply')
  end)
end

--- Shows `candidate_path` beside the user's file in diff mode, then asks before applying.
function M.open_candidate_diff(candidate_path)
  local original = find_original(candidate_path)
  if not original then
    return false
  end
  M.close_diff()
  local orig_buf = vim.fn.bufadd(original)
  vim.fn.bufload(orig_buf)
  local orig_win = vim.fn.bufwinid(orig_buf)
  if orig_win == -1 then
    vim.cmd('buffer ' .. orig_buf)
    orig_win = vim.api.nvim_get_current_win()
  end
  vim.api.nvim_set_current_win(orig_win)
  local cand_buf = vim.fn.bufadd(candidate_path)
  vim.b[cand_buf].kernel_lsp_candidate = true
  -- noautocmd: no FileType, so no LSP client attaches to (and compiles) the candidate.
  vim.cmd('noautocmd rightbelow vertical sbuffer ' .. cand_buf)
  local cand_win = vim.api.nvim_get_current_win()
  vim.bo[cand_buf].bufhidden = 'wipe'
  vim.bo[cand_buf].readonly = true
  vim.bo[cand_buf].syntax = vim.bo[orig_buf].filetype
  for _, win in ipairs({ orig_win, cand_win }) do
    vim.api.nvim_win_call(win, function()
      vim.cmd('diffthis')
    end)
  end
  M.state.diff = { orig_win = orig_win, cand_win = cand_win, cand_buf = cand_buf, original = original }
  -- Ask after this handler has answered the server (vim.ui.select may block).
  vim.schedule(function()
    -- Draw the split first: vim.ui.select's default (inputlist) blocks before the next
    -- redraw, which would ask about a diff the user cannot see yet.
    vim.cmd('redraw')
    local confirm = M.config.confirm or default_confirm
    confirm(M.apply_prompt(vim.fs.basename(original)), function(yes)
      if yes then
        -- Ids read at answer time: the search's result may arrive after its preview.
        local from_path = M.ref_from_path(candidate_path)
        local hint = M.state.last_preview or {}
        M.apply({ search = hint.search or from_path.search, candidate = hint.candidate or from_path.candidate })
      else
        M.close_diff()
      end
    end)
  end)
  return true
end

function M.on_show_document(err, params, ctx, config)
  if type(params) == 'table' and not params.external and M.is_candidate(params.uri) then
    local ok, shown = pcall(M.open_candidate_diff, vim.uri_to_fname(params.uri))
    if ok and shown then
      return { success = true }
    end
    if not ok then
      notify('candidate diff failed: ' .. tostring(shown), vim.log.levels.ERROR)
    end
  end
  return vim.lsp.handlers['window/showDocument'](err, params, ctx, config)
end

-- Setup ---------------------------------------------------------------------------------

--- The config table of lsp/kernel_lsp.lua with setup()'s options laid over it.
function M.lsp_config()
  local file = vim.api.nvim_get_runtime_file('lsp/kernel_lsp.lua', false)[1]
  local base = file and dofile(file) or {}
  local c = M.config
  local cfg = vim.tbl_deep_extend('force', base, {
    cmd = c.cmd,
    cmd_env = c.cmd_env,
    filetypes = c.filetypes,
    root_markers = c.root_markers,
  })
  -- An empty Lua table would go out as a JSON array; the server wants an object.
  local settings = next(c.settings or {}) and vim.deepcopy(c.settings) or vim.empty_dict()
  cfg.init_options = settings
  cfg.settings = { kernelLsp = settings }
  return cfg
end

local function start_fallback(group, cfg)
  -- Neovim 0.8 - 0.10: start (or reuse) a client per root on FileType.
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = cfg.filetypes,
    callback = function(ev)
      if vim.b[ev.buf].kernel_lsp_candidate or vim.bo[ev.buf].buftype ~= '' then
        return
      end
      local fname = vim.api.nvim_buf_get_name(ev.buf)
      local marker = vim.fs.find(cfg.root_markers, { upward = true, path = vim.fs.dirname(fname) })[1]
      local root = marker and vim.fs.dirname(marker) or vim.fs.dirname(fname)
      vim.lsp.start({
        name = NAME,
        -- Before 0.11 `capabilities` replaces the defaults instead of extending them.
        capabilities = vim.tbl_deep_extend('force', vim.lsp.protocol.make_client_capabilities(), cfg.capabilities or {}),
        cmd = cfg.cmd,
        cmd_env = cfg.cmd_env,
        root_dir = root,
        init_options = cfg.init_options,
        settings = cfg.settings,
        handlers = cfg.handlers,
      }, { bufnr = ev.buf })
    end,
  })
end

local function on_attach(group)
  vim.api.nvim_create_autocmd('LspAttach', {
    group = group,
    callback = function(ev)
      local client = vim.lsp.get_client_by_id(ev.data and ev.data.client_id or -1)
      if not client or client.name ~= NAME then
        return
      end
      if M.config.inlay_hints and vim.lsp.inlay_hint and vim.lsp.inlay_hint.enable then
        pcall(vim.lsp.inlay_hint.enable, true, { bufnr = ev.buf })
      end
      if M.config.codelens and vim.lsp.codelens then
        pcall(vim.lsp.codelens.refresh, { bufnr = ev.buf })
        vim.api.nvim_create_autocmd({ 'BufEnter', 'InsertLeave', 'BufWritePost' }, {
          group = group,
          buffer = ev.buf,
          callback = function(e)
            pcall(vim.lsp.codelens.refresh, { bufnr = e.buf })
          end,
        })
      end
    end,
  })
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', M.config, opts or {})
  M.create_commands()
  local group = vim.api.nvim_create_augroup('kernel_lsp', { clear = true })
  watch_progress(group)
  on_attach(group)
  local cfg = M.lsp_config()
  if vim.lsp.config and vim.lsp.enable then
    vim.lsp.config(NAME, cfg)
    vim.lsp.enable(NAME)
  else
    start_fallback(group, cfg)
  end
end

return M
