// Types of the dashboard's script, style and icon imports: Bun's `with { type: 'text' }` makes each
// a string; TypeScript 7.0 does not read the attribute and finds no type for a .js, .css or .svg.
declare module '*/app.js' {
  const text: string;
  export default text;
}

declare module '*.css' {
  const text: string;
  export default text;
}

declare module '*/uPlot.iife.min.js' {
  const text: string;
  export default text;
}

declare module '*.svg' {
  const text: string;
  export default text;
}
