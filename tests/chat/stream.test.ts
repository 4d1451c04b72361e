// Chat output encoding: the completion and the SSE chunks serialize to the OpenAI shapes, whatever
// the text.
import { describe, expect, test } from 'bun:test';
import { ChunkEncoder } from '../../src/chat/sse.ts';
import { completionBody } from '../../src/chat/stream.ts';

const AWKWARD =
  'quotes " and \\ backslash, a\nnewline, tab\t, unicode é ✓ 🙂, control \u0001, and </script>';

describe('completionBody', () => {
  test('a text answer', () => {
    const usage = { prompt_tokens: 9, completion_tokens: 20, total_tokens: 29 };
    expect(
      JSON.parse(
        JSON.stringify(
          completionBody('chatcmpl-abc', 1_767_225_600, 'model_03', AWKWARD, [], 'stop', usage),
        ),
      ),
    ).toEqual({
      id: 'chatcmpl-abc',
      object: 'chat.completion',
      created: 1_767_225_600,
      model: 'model_03',
      choices: [
        { index: 0, message: { role: 'assistant', content: AWKWARD }, finish_reason: 'stop' },
      ],
      usage,
    });
  });

  test('tool calls only: content null, tool_calls as given', () => {
    const toolCalls = [
      {
        id: 'call_1',
        type: 'function' as const,
        function: {
          name: 'get_weather',
          arguments: `{"city":"${AWKWARD.replaceAll('"', '\\"').replaceAll('\n', '\\n')}"}`,
        },
      },
    ];
    const usage = { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 };
    expect(
      JSON.parse(
        JSON.stringify(
          completionBody('chatcmpl-x', 1, 'vendor/model:1', null, toolCalls, 'tool_calls', usage),
        ),
      ),
    ).toEqual({
      id: 'chatcmpl-x',
      object: 'chat.completion',
      created: 1,
      model: 'vendor/model:1',
      choices: [
        {
          index: 0,
          message: { role: 'assistant', content: null, tool_calls: toolCalls },
          finish_reason: 'tool_calls',
        },
      ],
      usage,
    });
  });
});

describe('ChunkEncoder', () => {
  test('every frame is one SSE event whose data parses to a chat.completion.chunk', () => {
    const encoder = new ChunkEncoder('chatcmpl-abc', 5, 'model_03');
    const frames = [
      encoder.role(),
      encoder.text(AWKWARD),
      encoder.toolCall(0, 'call_1', 'f', '{"a":'),
      encoder.toolCall(0, null, null, '1}'),
      encoder.finish('tool_calls'),
      encoder.usage({ prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 }),
    ];
    const chunks = frames.map((frame) => {
      expect(frame.startsWith('data: ')).toBe(true);
      expect(frame.endsWith('\n\n')).toBe(true);
      expect(frame.slice(6, -2)).not.toContain('\n');
      return JSON.parse(frame.slice(6, -2)) as Record<string, unknown>;
    });
    for (const chunk of chunks)
      expect(chunk).toMatchObject({
        id: 'chatcmpl-abc',
        object: 'chat.completion.chunk',
        created: 5,
        model: 'model_03',
      });
    expect(chunks.map((chunk) => chunk.choices)).toEqual([
      [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }],
      [{ index: 0, delta: { content: AWKWARD }, finish_reason: null }],
      [
        {
          index: 0,
          delta: {
            tool_calls: [
              {
                index: 0,
                id: 'call_1',
                type: 'function',
                function: { name: 'f', arguments: '{"a":' },
              },
            ],
          },
          finish_reason: null,
        },
      ],
      [
        {
          index: 0,
          delta: { tool_calls: [{ index: 0, function: { arguments: '1}' } }] },
          finish_reason: null,
        },
      ],
      [{ index: 0, delta: {}, finish_reason: 'tool_calls' }],
      [],
    ]);
    expect(chunks.at(-1)!.usage).toEqual({
      prompt_tokens: 1,
      completion_tokens: 2,
      total_tokens: 3,
    });
  });
});
