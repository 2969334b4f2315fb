// Loaded with `node --require` before the tests: resolves `vscode` and
// `vscode-languageclient/node` to the mocks next to this file.
import Module = require("module");

const mocks: Record<string, string> = {
  vscode: require.resolve("./vscode-mock"),
  "vscode-languageclient/node": require.resolve("./languageclient-mock"),
};

const M = Module as unknown as { _resolveFilename: (request: string, ...rest: unknown[]) => string };
const original = M._resolveFilename;
M._resolveFilename = function (request: string, ...rest: unknown[]) {
  return mocks[request] ?? original.call(this, request, ...rest);
};
