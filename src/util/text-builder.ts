// Many small strings joined with little overhead (an upstream may send millions of tiny deltas).

/** Pieces joined per group: a few KB of text per join for typical deltas. */
const TEXT_PIECES_PER_GROUP = 256;

/**
 * Many small strings joined with little overhead: pieces are joined in groups, so neither a rope of
 * millions of nodes (`+=`) nor an array of millions of strings is ever held.
 */
export class TextBuilder {
  private readonly groups: string[] = [];
  private readonly pieces: string[] = [];

  append(text: string): void {
    if (text.length === 0) return;
    this.pieces.push(text);
    if (this.pieces.length === TEXT_PIECES_PER_GROUP) {
      this.groups.push(this.pieces.join(''));
      this.pieces.length = 0;
    }
  }

  build(): string {
    if (this.groups.length === 0)
      return this.pieces.length === 1 ? this.pieces[0]! : this.pieces.join('');
    return this.groups.join('') + this.pieces.join('');
  }
}
