-- Opens a .cu with a planted error and reports what the editor shows: the real
-- `kernel-lsp serve`, real nvcc, the plugin as installed.
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  H.setup()
  local out = H.out
  out.commands = {}
  for _, name in ipairs({ 'KernelLspOptimize', 'KernelLspBenchmark', 'KernelLspTune', 'KernelLspCancel', 'KernelLspReport' }) do
    out.commands[name] = vim.fn.exists(':' .. name) == 2
  end
  vim.cmd.edit(vim.fn.fnameescape(H.env('KLSP_FILE')))
  out.filetype = vim.bo.filetype
  out.attached = H.wait('client attached', function()
    return H.client() ~= nil and H.client().initialized
  end)
  if not out.attached then
    return
  end
  out.server_name = H.client().server_info and H.client().server_info.name
  local ecp = H.client().server_capabilities.executeCommandProvider
  out.server_commands = ecp and ecp.commands or {}
  if os.getenv('KLSP_PROBE_ONLY') then
    return
  end
  H.wait('an error diagnostic', function()
    for _, d in ipairs(vim.diagnostic.get(0)) do
      if d.severity == vim.diagnostic.severity.ERROR then
        return true
      end
    end
    return false
  end)
  out.diagnostics = H.diagnostics(0)
  -- The symbol the user commands would send as `target`, asked of the real server.
  local line = tonumber(os.getenv('KLSP_CURSOR_LINE') or '0')
  vim.api.nvim_win_set_cursor(0, { line + 1, 0 })
  out.target = require('kernel_lsp').target_at_cursor(0, 5000)
  out.document_args = require('kernel_lsp').document_args(0)
end)
