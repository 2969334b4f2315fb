-- The plugin's pure helpers, without a server: candidate names, status line, summaries.
package.path = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2)) .. '/?.lua;' .. package.path
local H = require('harness')

H.run(function()
  vim.opt.runtimepath:prepend(H.env('KLSP_PLUGIN'))
  local k = require('kernel_lsp')
  local out = H.out
  out.same_file = {
    k.same_file('softmax-c9.cu', 'softmax.cu'),
    k.same_file('softmax.cu', 'softmax.cu'),
    k.same_file('softmax-c9.py', 'softmax.cu'),
    k.same_file('softmax2-c9.cu', 'softmax.cu'),
    k.same_file('layer-norm-c9.cu', 'layer-norm.cu'),
  }
  out.is_candidate = { k.is_candidate('file:///ws/.kernel-lsp/candidates/a-1.cu'), k.is_candidate('/ws/a.cu') }
  out.ref_nested = k.ref_from_path('/ws/.kernel-lsp/candidates/7/c2/a.cu')
  out.ref_flat = k.ref_from_path('/ws/.kernel-lsp/candidates/a-c2.cu')
  k.on_status(nil, { jobs = { { id = 'job-1', title = 'Tune a.cu', uri = 'file:///ws/a.cu', message = 'round 1', bestSpeedup = 1.25 } } }, {}, {})
  out.status_running = vim.g.kernel_lsp_status
  out.last_uri = k.state.last_uri
  k.on_status(nil, { jobs = { { id = 'job-2', title = 'Optimize a.py', uri = 'file:///ws/a.py', message = 'round 2: expanding c1 · best 3.10x', bestSpeedup = 3.1 } } }, {}, {})
  out.status_message_with_best = vim.g.kernel_lsp_status
  k.on_status(nil, { jobs = {} }, {}, {})
  out.status_idle = vim.g.kernel_lsp_status
  local value = { title = 'Optimize rowsum.py', message = 'round 1: unusable answer · 1 proposals left', percentage = 66 }
  out.progress_full = k.progress_line(value, 200)
  out.progress_cut = k.progress_line(value, 40)
  out.progress_cut_width = vim.fn.strdisplaywidth(out.progress_cut)
  k.on_status(nil, { jobs = {}, documents = { { uri = vim.uri_from_bufnr(0), summary = 'correct · 2.00x eager · 0.90x torch.compile · 12.0 us ±1.0%' } } }, {}, {})
  out.status_document = vim.g.kernel_lsp_status
  local cu = { { uri = vim.uri_from_bufnr(0), summary = 'correct · 2.00x eager' } }
  k.on_status(nil, { jobs = {}, documents = cu, cluster = { executor = 'ray', state = 'connected', address = 'ray://gpu-box:10001', gpus = 2 } }, {}, {})
  out.status_cluster_connected = vim.g.kernel_lsp_status
  k.on_status(nil, { jobs = {}, documents = {}, cluster = { executor = 'ray', state = 'lost', address = 'ray://gpu-box:10001' } }, {}, {})
  out.status_cluster_lost = vim.g.kernel_lsp_status
  out.cluster_lost = k.state.cluster and k.state.cluster.state
  k.on_status(nil, { jobs = { { id = 'j', title = 'Benchmark a.py' } }, cluster = { executor = 'ray', state = 'unreachable' } }, {}, {})
  out.status_cluster_unreachable = vim.g.kernel_lsp_status
  k.on_status(nil, { jobs = {}, documents = cu, cluster = vim.NIL }, {}, {})
  out.status_cluster_local = vim.g.kernel_lsp_status
  out.cluster_local = k.state.cluster == nil
  out.fit = k.fit('kernel-lsp: a very long message\nover two lines', 28)
  out.fit_short = k.fit('short', 28)
  k.on_candidate(nil, { gain = '2.00x faster than your code, verified · 3.00x PyTorch eager · 1.10x torch.compile' }, {}, {})
  out.apply_prompt = k.apply_prompt('a.py')
  out.summary = k.benchmark_summary({ target = 'softmax', verdict = 'correct', time_ms = 0.5, speedup_eager = 2, speedup_compile = vim.NIL, message = '' })
end)
