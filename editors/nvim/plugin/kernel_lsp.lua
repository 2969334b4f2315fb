-- User commands exist as soon as the plugin is on 'runtimepath'; the server starts
-- only after require('kernel_lsp').setup() (or vim.lsp.enable('kernel_lsp') on 0.11+).
if vim.g.loaded_kernel_lsp then
  return
end
vim.g.loaded_kernel_lsp = true
require('kernel_lsp').create_commands()
