// The SSE parser gives the same events however the byte stream is split across reads.
import { describe, expect, test } from 'bun:test';
import { SseEventTooLargeError, SseParser } from '../../src/util/sse-parse.ts';

const encoder = new TextEncoder();

/** Feeds the reads in order and copies out the events (the parser reuses its result array). */
function parseReads(reads: Uint8Array[]): string[] {
  const parser = new SseParser();
  const events: string[] = [];
  for (const read of reads) events.push(...parser.feed(read));
  events.push(...parser.end());
  return events;
}

const CASES: { name: string; stream: string; events: string[] }[] = [
  { name: 'LF line ends', stream: 'data: a\n\ndata: b\n\n', events: ['a', 'b'] },
  { name: 'CRLF line ends', stream: 'data: a\r\n\r\ndata: b\r\n\r\n', events: ['a', 'b'] },
  { name: 'CR line ends', stream: 'data: a\r\rdata: b\r\r', events: ['a', 'b'] },
  {
    name: 'mixed line ends',
    stream: 'data: a\r\n\ndata: b\r\rdata: c\n\r\n',
    events: ['a', 'b', 'c'],
  },
  {
    name: 'multi-line data joined with LF',
    stream: 'data: line one\r\ndata:line two\ndata:  indented\r\n\r\n',
    events: ['line one\nline two\n indented'],
  },
  {
    name: 'comments and other fields ignored',
    stream:
      ': keep-alive\n\nevent: message\nid: 7\nretry: 1000\n: note\ndata: x\n\ndatabase: ' +
      'no\ndata2: no\n\n',
    events: ['x'],
  },
  { name: 'empty data values', stream: 'data\n\ndata:\n\ndata: \n\n', events: ['', '', ''] },
  {
    name: 'an event without data is not dispatched',
    stream: 'event: ping\n\n\n\ndata: after\n\n',
    events: ['after'],
  },
  {
    name: 'multi-byte UTF-8',
    stream: 'data: héllo 🌍 日本語\n\ndata: ✓\r\n\r\n',
    events: ['héllo 🌍 日本語', '✓'],
  },
  {
    name: 'an unterminated final event is discarded',
    stream: 'data: whole\n\ndata: cut off',
    events: ['whole'],
  },
  {
    name: 'a final line without the blank line is discarded',
    stream: 'data: whole\n\ndata: [DONE]\n',
    events: ['whole'],
  },
  {
    name: 'OpenAI chunks',
    stream:
      'data: ' +
      '{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Hi"},' +
      '"finish_reason":null}]}\n\n' +
      'data: ' +
      '{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n' +
      'data: [DONE]\n\n',
    events: [
      '{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}',
      '{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}',
      '[DONE]',
    ],
  },
];

describe('SseParser', () => {
  for (const { name, stream, events } of CASES) {
    test(
      `${name}: in one read, split at every byte ` + `offset and pair of offsets, and byte by byte`,
      () => {
        const bytes = encoder.encode(stream);
        expect(parseReads([bytes])).toEqual(events);
        for (let at = 0; at <= bytes.length; at++) {
          expect(parseReads([bytes.subarray(0, at), bytes.subarray(at)])).toEqual(events);
          for (let second = at; second <= bytes.length; second++) {
            expect(
              parseReads([
                bytes.subarray(0, at),
                bytes.subarray(at, second),
                bytes.subarray(second),
              ]),
            ).toEqual(events);
          }
        }
        const singleBytes: Uint8Array[] = [];
        for (let i = 0; i < bytes.length; i++) singleBytes.push(bytes.subarray(i, i + 1));
        expect(parseReads(singleBytes)).toEqual(events);
      },
    );
  }

  test('a CR at the end of one read and a LF at the start of the next are one line end', () => {
    const parser = new SseParser();
    expect([...parser.feed(encoder.encode('data: a\r'))]).toEqual([]);
    // Taken as a blank line, this LF would end the event early, as "a" alone.
    expect([...parser.feed(encoder.encode('\ndata: b\r'))]).toEqual([]);
    expect([...parser.feed(encoder.encode('\n\r'))]).toEqual(['a\nb']);
  });

  test('events come out of the read that completes them', () => {
    const parser = new SseParser();
    expect([...parser.feed(encoder.encode('data: one\n'))]).toEqual([]);
    expect([...parser.feed(encoder.encode('\ndata: two\n\ndata: th'))]).toEqual(['one', 'two']);
    expect([...parser.feed(encoder.encode('ree\n\n'))]).toEqual(['three']);
  });

  test('an event over the size bound is refused', () => {
    const parser = new SseParser(16);
    expect(() => parser.feed(encoder.encode('data: 0123456789abcdefgh'))).toThrow(
      SseEventTooLargeError,
    );
    const multiLine = new SseParser(16);
    expect(() => multiLine.feed(encoder.encode('data: 0123456789\ndata: abcdefgh\n'))).toThrow(
      SseEventTooLargeError,
    );
  });

  test(
    'the bound counts the bytes of the event as ' + 'sent, not its characters, in one read or many',
    () => {
      // "data: " and 8 characters of 3 bytes each: 14 characters, 30 bytes.
      const event = encoder.encode('data: 日本語日本語日本\n\n');
      expect([...new SseParser(30).feed(event)]).toEqual(['日本語日本語日本']);
      expect(() => new SseParser(29).feed(event)).toThrow(SseEventTooLargeError);
      const split = new SseParser(29);
      expect(() => {
        for (let i = 0; i < event.length; i++) split.feed(event.subarray(i, i + 1));
      }).toThrow(SseEventTooLargeError);
      const exact = new SseParser(30);
      const events: string[] = [];
      for (let i = 0; i < event.length; i++) events.push(...exact.feed(event.subarray(i, i + 1)));
      expect(events).toEqual(['日本語日本語日本']);
    },
  );

  test(
    'comment and field lines count toward their event, and the count starts again at each ' +
      'blank line',
    () => {
      // Endless keep-alives, each its own event, never pass the bound: nothing builds up between
      // events.
      const keepAlive = new SseParser(16);
      const ping = encoder.encode(': keep-alive\n\nevent: ping\n\ndata: {}\n\n');
      for (let i = 0; i < 10_000; i++) expect([...keepAlive.feed(ping)]).toEqual(['{}']);
      // Comment lines with no blank line between them are one event that keeps growing.
      const endless = new SseParser(64);
      expect(() => {
        for (let i = 0; i < 100; i++) endless.feed(encoder.encode(': still here\n'));
      }).toThrow(SseEventTooLargeError);
    },
  );
});
