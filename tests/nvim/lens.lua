-- Lenses refresh on their own: open a KernelBench file, :w, and the measured lens appears
-- without the test (or the user) calling vim.lsp.codelens.refresh().
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  local out = H.out
  out.notifications = {}
  local notify = vim.notify
  vim.notify = function(msg, level, opts)
    table.insert(out.notifications, msg)
    return notify(msg, level, opts)
  end
  H.setup()
  local refresh = vim.lsp.codelens.refresh
  out.refresh_calls = 0
  vim.lsp.codelens.refresh = function(...) -- counted, not replaced: the plugin's own calls
    out.refresh_calls = out.refresh_calls + 1
    return refresh(...)
  end
  local plugin = require('kernel_lsp')
  vim.cmd.edit(vim.fn.fnameescape(vim.fn.fnamemodify(H.env('KLSP_FILE'), ':p')))
  local buf = vim.api.nvim_get_current_buf()
  out.attached = H.wait('client attached', function()
    return H.client() ~= nil and H.client().initialized
  end)
  local function titles()
    local list = {}
    for _, lens in ipairs(vim.lsp.codelens.get(buf)) do
      if lens.command then
        table.insert(list, lens.command.title)
      end
    end
    return list
  end
  local function lens_starting(prefix)
    for _, t in ipairs(titles()) do
      if vim.startswith(t, prefix) then
        return t
      end
    end
  end
  H.wait('the first lenses', function()
    return #titles() > 0
  end, 30000)
  out.first = titles()
  vim.cmd('write')
  H.wait('a measured lens', function()
    return lens_starting(os.getenv('KLSP_LENS_PREFIX') or 'correct ·') ~= nil
  end, tonumber(os.getenv('KLSP_MEASURE_TIMEOUT_MS') or '200000'))
  out.measured = titles()
  out.statusline = plugin.statusline()
  -- An edit: the lens says the numbers are of the earlier text, still with no manual refresh.
  vim.api.nvim_buf_set_lines(buf, -1, -1, false, { '# an edit after the measurement' })
  vim.api.nvim_exec_autocmds('InsertLeave', { buffer = buf })
  H.wait('a stale lens', function()
    return lens_starting('edited since measured') ~= nil
  end, 20000)
  out.stale = titles()
  out.statusline_stale = plugin.statusline()
end)
