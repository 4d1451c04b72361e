// Many small strings joined with little overhead (an upstream may send millions of tiny deltas).

/** Pieces joined per group: a few KB of text per join for typical deltas. */
const TEXT_PIECES_PER_GROUP = 256;

/**
 * Many small strings joined with little overhead: pieces are joined in groups, so neither a rope of
 * millions of nodes (`+=`) nor an array of millions of strings is ever held. Its arrays are made on
 * need: most texts are one piece (a whole answer), kept as it is, and never fill a group.
 */
export class TextBuilder {
  private groups: string[] | null = null;
  /** The pieces since the last group; null while there is at most one, kept in `first`. */
  private pieces: string[] | null = null;
  private first: string | null = null;

  append(text: string): void {
    if (text.length === 0) return;
    let pieces = this.pieces;
    if (pieces === null) {
      if (this.first === null) {
        this.first = text;
        return;
      }
      pieces = this.pieces = [this.first];
      this.first = null;
    }
    pieces.push(text);
    if (pieces.length === TEXT_PIECES_PER_GROUP) {
      (this.groups ??= []).push(pieces.join(''));
      pieces.length = 0;
    }
  }

  build(): string {
    const pieces = this.pieces;
    let tail: string;
    if (pieces === null) tail = this.first ?? '';
    else tail = pieces.length === 1 ? pieces[0]! : pieces.join('');
    return this.groups === null ? tail : this.groups.join('') + tail;
  }
}
