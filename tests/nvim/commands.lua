-- The user commands against the real server: :KernelLspBenchmark with the kernel under
-- the cursor, then :KernelLspCancel; what the user was told is reported.
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  local out = H.out
  out.notifications = {}
  vim.notify = function(msg)
    table.insert(out.notifications, msg)
  end
  H.setup()
  vim.cmd.edit(vim.fn.fnameescape(H.env('KLSP_FILE')))
  out.attached = H.wait('client attached', function()
    return H.client() ~= nil and H.client().initialized
  end)
  if not out.attached then
    return
  end
  local plugin = require('kernel_lsp')
  vim.api.nvim_win_set_cursor(0, { tonumber(H.env('KLSP_CURSOR_LINE')) + 1, 0 })
  out.args = plugin.document_args(0)
  local summary = plugin.benchmark_summary
  plugin.benchmark_summary = function(result) -- see the server's answer as the command does
    out.benchmark_result = result
    return summary(result)
  end
  vim.cmd('KernelLspBenchmark')
  H.wait('the benchmark result', function()
    return out.benchmark_result ~= nil
  end, 120000)
  out.progress = plugin.state.progress
  vim.cmd('KernelLspCancel')
  H.wait('the cancel answer', function()
    return out.notifications[#out.notifications]:find('cancel', 1, true) ~= nil
  end, 10000)
end)
