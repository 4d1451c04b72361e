// Lines over 100 columns (the formatter wraps code, not strings or comments): listed, exit 1.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

const WIDTH = 100;
const files = execFileSync('git', ['ls-files', '*.ts', '*.mjs'], { encoding: 'utf8' })
  .split('\n')
  .filter(Boolean);
let over = 0;
for (const file of files) {
  const lines = readFileSync(file, 'utf8').split('\n');
  lines.forEach((line, index) => {
    // Columns are characters as the eye counts them (code points), not UTF-16 units or bytes.
    if ([...line].length > WIDTH) {
      over++;
      console.log(`${file}:${index + 1}: ${[...line].length} columns`);
    }
  });
}
if (over > 0) {
  console.log(`${over} lines over ${WIDTH} columns`);
  process.exit(1);
}
