// `import path from './x.bin' with { type: 'file' }`: Bun gives the file's path (inside the single
// binary, a path Bun's fs reads from the embedded copy).
declare module '*.bin' {
  const path: string;
  export default path;
}
