-- :checkhealth kernel_lsp: write what the health buffer says.
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  H.setup()
  vim.cmd('checkhealth kernel_lsp')
  H.out.lines = vim.api.nvim_buf_get_lines(0, 0, -1, false)
end)
