-- kernel-lsp for Neovim 0.11+: picked up by vim.lsp.config('kernel_lsp') / vim.lsp.enable('kernel_lsp').
-- Override any field with vim.lsp.config('kernel_lsp', {...}) or require('kernel_lsp').setup({...}).
return {
  cmd = { 'kernel-lsp', 'serve' },
  filetypes = { 'cuda', 'python' },
  root_markers = { 'pyproject.toml', '.git' },
  -- The server reads the same object from initializationOptions and from
  -- workspace/configuration (section "kernelLsp"); see :help kernel_lsp-settings.
  init_options = {},
  -- This plugin shows the candidate diff and asks itself, so the server must not also
  -- ask with window/showMessageRequest. (0.11 merges this into the default capabilities.)
  capabilities = { experimental = { kernelLsp = { candidatePreview = true } } },
  settings = { kernelLsp = {} },
  handlers = {
    -- Looked up lazily so that this file loads without the Lua module on 'runtimepath' order.
    ['kernel-lsp/status'] = function(...)
      return require('kernel_lsp').on_status(...)
    end,
    ['window/showDocument'] = function(...)
      return require('kernel_lsp').on_show_document(...)
    end,
    ['kernel-lsp/candidate'] = function(...)
      return require('kernel_lsp').on_candidate(...)
    end,
    ['window/showMessage'] = function(...)
      return require('kernel_lsp').on_show_message(...)
    end,
  },
}
