-- Optimize a kernel from the editor and check the diff comes before the edit:
-- trigger (code action or :KernelLspOptimize) -> progress and status -> candidate shown
-- in a diff split -> the user answers -> applyCandidate -> the buffer changes.
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  local out = H.out
  local answer = os.getenv('KLSP_ANSWER') or 'apply'
  local marker = os.getenv('KLSP_CANDIDATE_MARKER') or ''
  -- With KLSP_EXPECTED_FILE the edit counts as applied when the buffer holds exactly that
  -- file; without it, when line 4 is the scripted server's marker.
  local expected_file = os.getenv('KLSP_EXPECTED_FILE')
  local expected = expected_file and expected_file ~= '' and vim.fn.readfile(expected_file) or nil
  local function applied_in(b)
    local lines = vim.api.nvim_buf_get_lines(b, 0, -1, false)
    if expected then
      return vim.deep_equal(lines, expected)
    end
    return lines[4] == marker
  end
  local function text_of(b)
    return table.concat(vim.api.nvim_buf_get_lines(b, 0, -1, false), '\n')
  end
  local plugin
  out.statuses = {}
  out.notifications = {}
  out.executed = {} -- commands the plugin sent itself (M.exec), in order
  local notify = vim.notify
  vim.notify = function(msg, level, opts)
    table.insert(out.notifications, msg)
    return notify(msg, level, opts)
  end
  H.setup({
    confirm = function(prompt, callback)
      -- Snapshot what the user sees when asked, before anything is applied.
      local d = plugin.state.diff
      out.asked = {
        prompt = prompt,
        orig_diff = vim.wo[d.orig_win].diff,
        cand_diff = vim.wo[d.cand_win].diff,
        cand_name = vim.api.nvim_buf_get_name(d.cand_buf),
        cand_has_lsp = #vim.lsp.get_clients({ bufnr = d.cand_buf }) > 0,
        orig_is_file = vim.api.nvim_buf_get_name(vim.api.nvim_win_get_buf(d.orig_win)) == vim.fn.fnamemodify(H.env('KLSP_FILE'), ':p'),
        buffer_changed_before_answer = applied_in(vim.api.nvim_win_get_buf(d.orig_win)),
        orig_text = text_of(vim.api.nvim_win_get_buf(d.orig_win)),
        cand_text = text_of(d.cand_buf),
        cand_modifiable = vim.bo[d.cand_buf].modifiable and not vim.bo[d.cand_buf].readonly,
        windows = #vim.api.nvim_tabpage_list_wins(0),
      }
      callback(answer == 'apply')
    end,
  })
  plugin = require('kernel_lsp')
  local exec = plugin.exec
  plugin.exec = function(command, arg, ...)
    table.insert(out.executed, { command = command, arg = arg })
    return exec(command, arg, ...)
  end
  vim.api.nvim_create_autocmd('User', {
    pattern = 'KernelLspStatus',
    callback = function()
      table.insert(out.statuses, { jobs = #plugin.state.jobs, line = vim.g.kernel_lsp_status })
    end,
  })
  local file = vim.fn.fnamemodify(H.env('KLSP_FILE'), ':p')
  vim.cmd.edit(vim.fn.fnameescape(file))
  local buf = vim.api.nvim_get_current_buf()
  out.attached = H.wait('client attached', function()
    return H.client() ~= nil and H.client().initialized
  end)
  if not out.attached then
    return
  end
  vim.api.nvim_win_set_cursor(0, { tonumber(os.getenv('KLSP_CURSOR_LINE') or '1') + 1, 0 })
  local trigger = os.getenv('KLSP_TRIGGER') or 'command'
  out.trigger = trigger
  local want = os.getenv('KLSP_ACTION_COMMAND') or 'kernel-lsp.optimize'
  if trigger == 'code_action' then
    vim.lsp.buf.code_action({
      apply = true,
      filter = function(action)
        -- A CodeAction carries a Command table; a bare Command has the name itself.
        local c = action.command
        c = type(c) == 'table' and c.command or c
        return c == want
      end,
    })
  else
    vim.cmd('KernelLspOptimize')
  end
  -- A search either shows a candidate or ends its progress without one (the guard).
  local function ended()
    for _, p in ipairs(plugin.state.progress) do
      if p.kind == 'end' then
        return true
      end
    end
    return false
  end
  H.wait('the candidate question or the end of the search', function()
    return out.asked ~= nil or (ended() and #plugin.state.jobs == 0)
  end, tonumber(os.getenv('KLSP_OPTIMIZE_TIMEOUT_MS') or tostring(H.timeout)))
  vim.wait(500, function()
    return out.asked ~= nil
  end, 50) -- a preview may follow the end of the progress
  out.progress_ended = ended()
  local function has_marker()
    return applied_in(buf)
  end
  if answer == 'apply' and out.asked then
    H.wait('the applied edit', has_marker)
  else
    vim.wait(1000, has_marker, 50) -- give a wrong apply the chance to show up
  end
  H.wait('the diff closed', function()
    return plugin.state.diff == nil
  end, 5000)
  out.buffer_changed = has_marker()
  out.buffer_text = text_of(buf)
  out.buffer_modified = vim.bo[buf].modified
  out.windows_after = #vim.api.nvim_tabpage_list_wins(0)
  out.orig_diff_after = vim.wo.diff
  out.progress = plugin.state.progress
  out.last_preview = plugin.state.last_preview
end)
