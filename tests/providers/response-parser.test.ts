// The HTTP/1.1 response parser: framing (length, chunked, close), split reads, keep-alive,
// malformed answers.
import { describe, expect, test } from 'bun:test';
import {
  HttpProtocolError,
  type ResponseHead,
  ResponseParser,
} from '../../src/providers/http/response-parser.ts';

interface Parsed {
  status: number | null;
  headers: Record<string, string>;
  body: string;
  ended: boolean;
  keepAlive: boolean;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Feeds `reads` (each one read) to a parser, then optionally a close; returns what it reported. */
function parse(
  reads: Uint8Array[],
  options: { close?: boolean; headBytesMax?: number } = {},
): Parsed {
  const result: Parsed = { status: null, headers: {}, body: '', ended: false, keepAlive: false };
  const parts: Uint8Array[] = [];
  const parser = new ResponseParser(
    {
      head(head: ResponseHead) {
        expect(result.status).toBeNull();
        result.status = head.status;
        result.headers = Object.fromEntries(head.headers);
      },
      body(bytes) {
        expect(result.ended).toBe(false);
        parts.push(bytes.slice());
      },
      end() {
        expect(result.ended).toBe(false);
        result.ended = true;
      },
    },
    options.headBytesMax,
  );
  for (const read of reads) parser.feed(read);
  if (options.close) parser.close();
  result.body = decoder.decode(Buffer.concat(parts));
  result.keepAlive = parser.keepAlive;
  return result;
}

/** The same bytes cut at every position into two reads, and into single-byte reads. */
function everySplit(text: string): Uint8Array[][] {
  const bytes = encoder.encode(text);
  const splits: Uint8Array[][] = [[bytes], Array.from(bytes, (byte) => Uint8Array.of(byte))];
  for (let cut = 1; cut < bytes.length; cut++)
    splits.push([bytes.subarray(0, cut), bytes.subarray(cut)]);
  return splits;
}

function expectProtocolError(
  text: string,
  message: RegExp,
  options: { headBytesMax?: number } = {},
): void {
  let caught: unknown = null;
  try {
    parse([encoder.encode(text)], options);
  } catch (error) {
    caught = error;
  }
  expect(caught).toBeInstanceOf(HttpProtocolError);
  expect((caught as Error).message).toMatch(message);
}

describe('framing', () => {
  test('a Content-Length body, cut at every byte, parses the same', () => {
    const body = '{"id":"chatcmpl-1","choices":[],"text":"héllo ✓"}';
    const response =
      `HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: ` +
      `${encoder.encode(body).length}\r\nX-Two: a\r\nx-two: b\r\n\r\n${body}`;
    for (const reads of everySplit(response)) {
      expect(parse(reads)).toEqual({
        status: 200,
        headers: {
          'content-type': 'application/json',
          'content-length': String(encoder.encode(body).length),
          'x-two': 'a, b',
        },
        body,
        ended: true,
        keepAlive: true,
      });
    }
  });

  test('a chunked body with extensions and trailers, cut at every byte, parses the same', () => {
    const response =
      'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n' +
      '7\r\ndata: a\r\n' +
      'B;name=value\r\n\n\ndata: [DO\r\n' +
      '4\r\nNE]\n\r\n' +
      '0\r\nx-trailer: yes\r\n\r\n';
    for (const reads of everySplit(response)) {
      expect(parse(reads)).toEqual({
        status: 200,
        headers: { 'content-type': 'text/event-stream', 'transfer-encoding': 'chunked' },
        body: 'data: a\n\ndata: [DONE]\n',
        ended: true,
        keepAlive: true,
      });
    }
  });

  test('body parts at and past the copy bound (16 KiB) come out whole, Buffer or not', () => {
    // Parts up to the bound are copied out of the read, larger ones viewed: both the same bytes.
    const sizes = [1, 16 * 1024 - 1, 16 * 1024, 16 * 1024 + 1, 40_000];
    const data = sizes.map((size, n) =>
      Array.from({ length: size }, (_, i) => String.fromCharCode(97 + ((i + n) % 26))).join(''),
    );
    const chunked =
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n' +
      data.map((d) => `${d.length.toString(16)}\r\n${d}\r\n`).join('') +
      '0\r\n\r\n';
    const whole = data.join('');
    const length = `HTTP/1.1 200 OK\r\ncontent-length: ${whole.length}\r\n\r\n${whole}`;
    for (const text of [chunked, length]) {
      const bytes = encoder.encode(text);
      for (const read of [bytes, Buffer.from(bytes)]) {
        const parsed = parse([read]);
        expect(parsed.ended).toBe(true);
        expect(parsed.body).toBe(whole);
      }
    }
  });

  test('chunk sizes of either case, up to 13 digits, spaced or bare-LF, cut at every byte', () => {
    // Sizes whole in one read are read from the bytes; split or unusual ones, as text: both alike.
    const response =
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n' +
      `1A\r\n${'x'.repeat(26)}\r\n` +
      '0000000000001\r\ny\r\n' +
      ' a \r\n0123456789\r\n' +
      '2\r\r\nzz\r\n' +
      '3\nabc\n' +
      '00\r\n\r\n';
    for (const reads of everySplit(response)) {
      expect(parse(reads)).toEqual({
        status: 200,
        headers: { 'transfer-encoding': 'chunked' },
        body: `${'x'.repeat(26)}y0123456789zzabc`,
        ended: true,
        keepAlive: true,
      });
    }
  });

  test('bare LF line endings are accepted', () => {
    expect(parse([encoder.encode('HTTP/1.1 200 OK\ncontent-length: 2\n\nok')])).toMatchObject({
      status: 200,
      body: 'ok',
      ended: true,
      keepAlive: true,
    });
    expect(
      parse([encoder.encode('HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n2\nok\n0\n\n')]),
    ).toMatchObject({ body: 'ok', ended: true });
  });

  test('a body without length ends with the connection, which is then not reused', () => {
    const reads = [
      encoder.encode('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"a":'),
      encoder.encode('1}'),
    ];
    expect(parse(reads)).toMatchObject({ body: '{"a":1}', ended: false });
    expect(parse(reads, { close: true })).toMatchObject({
      body: '{"a":1}',
      ended: true,
      keepAlive: false,
    });
  });

  test('204 and a zero Content-Length end at the head', () => {
    // A 204's connection is not kept: bytes a broken upstream sent after it would be read as the
    // next request's answer (another key's, maybe).
    expect(parse([encoder.encode('HTTP/1.1 204 No Content\r\n\r\n')])).toMatchObject({
      status: 204,
      body: '',
      ended: true,
      keepAlive: false,
    });
    expect(parse([encoder.encode('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n')])).toMatchObject({
      status: 200,
      body: '',
      ended: true,
    });
  });

  test('the head carries the declared body size, before any of the body is read', () => {
    const heads: (number | null)[] = [];
    const sizeOf = (text: string) => {
      const parser = new ResponseParser({
        head: (head) => heads.push(head.bodyBytes),
        body() {},
        end() {},
      });
      parser.feed(encoder.encode(text));
      return heads.pop();
    };
    expect(sizeOf('HTTP/1.1 200 OK\r\ncontent-length: 17179869184\r\n\r\n')).toBe(17_179_869_184);
    expect(sizeOf('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n')).toBe(0);
    expect(sizeOf('HTTP/1.1 204 No Content\r\n\r\n')).toBe(0);
    expect(
      sizeOf('HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n'),
    ).toBeNull();
    expect(sizeOf('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n')).toBeNull();
  });

  test('interim 1xx answers are skipped', () => {
    const parsed = parse(
      everySplit(
        'HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\nHTTP/1.1 ' +
          '201 Created\r\ncontent-length: 1\r\n\r\nx',
      )[0]!,
    );
    expect(parsed).toEqual({
      status: 201,
      headers: { 'content-length': '1' },
      body: 'x',
      ended: true,
      keepAlive: true,
    });
  });

  test('obs-fold continues the previous field', () => {
    expect(
      parse([
        encoder.encode('HTTP/1.1 200 OK\r\nx-long: one\r\n  two\r\ncontent-length: 0\r\n\r\n'),
      ]).headers['x-long'],
    ).toBe('one two');
  });

  test('a cut-off answer is not complete on close', () => {
    const parser = new ResponseParser({ head() {}, body() {}, end() {} });
    expect(parser.started).toBe(false);
    expect(parser.close()).toBe(false);
    parser.feed(encoder.encode('HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc'));
    expect(parser.started).toBe(true);
    expect(parser.close()).toBe(false);
    expect(parser.done).toBe(false);
  });
});

describe('keep-alive', () => {
  const ok = (head: string) =>
    parse([encoder.encode(`${head}\r\ncontent-length: 1\r\n\r\nx`)]).keepAlive;

  test('HTTP/1.1 keeps the connection unless it says close', () => {
    expect(ok('HTTP/1.1 200 OK')).toBe(true);
    expect(ok('HTTP/1.1 200 OK\r\nconnection: keep-alive')).toBe(true);
    expect(ok('HTTP/1.1 200 OK\r\nConnection: Close')).toBe(false);
    expect(ok('HTTP/1.1 200 OK\r\nconnection: upgrade, close')).toBe(false);
  });

  test('HTTP/1.0 is never reused', () => {
    expect(ok('HTTP/1.0 200 OK\r\nconnection: keep-alive')).toBe(false);
  });

  test('Transfer-Encoding with Content-Length is read as chunked and not reused', () => {
    const parsed = parse([
      encoder.encode(
        'HTTP/1.1 200 OK\r\ncontent-length: ' +
          '99\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\n',
      ),
    ]);
    expect(parsed).toMatchObject({ body: 'x', ended: true, keepAlive: false });
  });

  test('bytes after a complete answer make the connection unusable', () => {
    expect(
      parse([encoder.encode('HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxHTTP/1.1 200 OK\r\n')]),
    ).toMatchObject({ body: 'x', ended: true, keepAlive: false });
  });
});

describe('malformed answers', () => {
  test('a bad status line', () => {
    expectProtocolError('HTTP/2 200 OK\r\n\r\n', /status line/);
    expectProtocolError('ICY 200 OK\r\n\r\n', /status line/);
    expectProtocolError('HTTP/1.1 20 OK\r\n\r\n', /status line/);
    // No status, not an interim one: the answer that followed would have been taken as it.
    expectProtocolError('HTTP/1.1 000 Zero\r\n\r\nHTTP/1.1 200 OK\r\n\r\n', /status line/);
    expectProtocolError('HTTP/1.1 099 Low\r\n\r\n', /status line/);
  });

  test('another protocol is refused at its first bytes, not when its head would end', () => {
    for (const banner of ['SSH-2.0-OpenSSH_9.6\r\n', 'HTX', '\u0015\u0003\u0001\u0000\u0002'])
      for (const reads of everySplit(banner)) {
        let caught: unknown = null;
        try {
          parse(reads);
        } catch (error) {
          caught = error;
        }
        expect(caught).toBeInstanceOf(HttpProtocolError);
        expect((caught as Error).message).toMatch(/status line/);
      }
    // A status line arriving a byte at a time is still waited for.
    expect(parse(everySplit('HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n')[1]!).status).toBe(200);
  });

  test('bad or conflicting Content-Length', () => {
    expectProtocolError('HTTP/1.1 200 OK\r\ncontent-length: 1x\r\n\r\n', /content-length/);
    expectProtocolError('HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n', /content-length/);
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n',
      /conflicting/,
    );
  });

  test('a bad chunk size, or chunk data without its CRLF', () => {
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n',
      /chunk size/,
    );
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffff\r\n',
      /chunk size/,
    );
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n00000000000000\r\n',
      /chunk size/,
    );
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-1\r\n',
      /chunk size/,
    );
    expectProtocolError('HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nxy', /CRLF/);
  });

  test('a field line without a name, and a continuation with nothing to continue', () => {
    expectProtocolError('HTTP/1.1 200 OK\r\n: value\r\n\r\n', /header field/);
    expectProtocolError('HTTP/1.1 200 OK\r\nno colon here\r\n\r\n', /header field/);
    expectProtocolError('HTTP/1.1 200 OK\r\n bad\r\n\r\n', /continuation/);
  });

  test('an unsupported transfer coding, and a protocol switch', () => {
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n',
      /transfer-encoding/,
    );
    // The provider's text stays out of the message (it reaches the client in a 502).
    expectProtocolError(
      'HTTP/1.1 200 OK\r\ntransfer-encoding: SECRET-UPSTREAM-TEXT\r\n\r\n',
      /^unsupported transfer-encoding$/,
    );
    expectProtocolError('HTTP/1.1 101 Switching Protocols\r\n\r\n', /protocol switch/);
  });

  test('a head over the limit, in one read or in many', () => {
    const long = `HTTP/1.1 200 OK\r\nx-big: ${'a'.repeat(200)}\r\n\r\n`;
    expectProtocolError(long, /head over 100 bytes/, { headBytesMax: 100 });
    let caught: unknown = null;
    try {
      parse(everySplit(`HTTP/1.1 200 OK\r\nx-big: ${'a'.repeat(200)}`)[1]!, { headBytesMax: 100 });
    } catch (error) {
      caught = error;
    }
    expect((caught as Error).message).toMatch(/head over 100 bytes/);
  });
});
