#!/usr/bin/env node
// kafkajs as a KafScale test client: the driver behind tests/harness/kafkajs.py.
//
// Usage: node driver.js [COMMAND_JSON]   (without an argument the command is read from stdin)
//
//   {"op": "produce", "bootstrap": "host:port", "topic": T, "codec": "none|gzip|snappy|lz4|zstd",
//    "records": [{"partition": P, "key_b64": B|null, "value_b64": B,
//                 "headers": [[name, B], ...], "timestamp": ms|null}, ...]}
//     sends every record to its partition, in order (acks=-1, idempotent), and prints one line
//     {"acknowledged": [{"partition": P, "offset": O}, ...]} in input order.
//
//   {"op": "consume", "bootstrap": ..., "topics": [T, ...], "partitions": [P, ...],
//    "start": "earliest" | "latest" | ms, "count": N, "timeout_ms": MS}
//     kafkajs consumes only through a consumer group: it joins a fresh group (never committed),
//     resolves each partition's start offset with the admin client (low / high watermark, or
//     fetchTopicOffsetsByTimestamp, which falls back to the high watermark), seeks every
//     partition there, prints {"ready": true} once those offsets are fixed, then one line per
//     record {"topic","partition","offset","key_b64","value_b64","headers","timestamp"} in the
//     order kafkajs delivered them, until N records of the wanted partitions arrived or the
//     timeout passed, and last {"done": true, "received": N}.
//
// Binary data is base64 (B); null stays null. kafkajs logs go to stderr (stdout is the protocol).
//
// Security: every client (produce, consume, and group.js's members and admin) connects as the
// environment says, read in one place, security() below (tests/harness/drivers.py sets it);
// unset, in plaintext without authentication, as before. A variable the protocol does not use is
// refused (exit 2).
//   KAFSCALE_DRIVER_SECURITY_PROTOCOL  PLAINTEXT (the default), SSL, SASL_PLAINTEXT or SASL_SSL
//   KAFSCALE_DRIVER_CA_FILE            SSL, SASL_SSL: PEM CA certificates to trust (default:
//                                      Node's); the broker's name is checked against its address
//   KAFSCALE_DRIVER_SASL_MECHANISM     SASL_*: SCRAM-SHA-512 (the default), SCRAM-SHA-256 or PLAIN
//   KAFSCALE_DRIVER_SASL_USERNAME      SASL_*: the user (required)
//   KAFSCALE_DRIVER_SASL_PASSWORD      SASL_*: its password
//
// Headers: kafkajs takes and returns a record's headers as an object (name -> value, or an
// array of values for a repeated name), which cannot hold names repeated apart from each other
// ("a","b","a") nor keep the order of integer-like names ("1", "7"): produce refuses such
// headers (exit 2). On consume, the object would lose the wire order, so the driver wraps
// kafkajs's own header decoder to keep each record's headers as decoded, in order, and checks
// they agree with the object kafkajs hands out.
'use strict'

const fs = require('fs')
const path = require('path')

// --- ordered headers: wrap kafkajs's header and record decoders before kafkajs loads them ------
const KAFKAJS = path.dirname(require.resolve('kafkajs/package.json'))
const RECORD_BATCH = path.join(KAFKAJS, 'src', 'protocol', 'recordBatch')
const headerPath = require.resolve(path.join(RECORD_BATCH, 'header', 'v0', 'decoder.js'))
const recordPath = require.resolve(path.join(RECORD_BATCH, 'record', 'v0', 'decoder.js'))
let decodedHeaders = []
const decodeHeader = require(headerPath)
require.cache[headerPath].exports = decoder => {
  const header = decodeHeader(decoder)
  decodedHeaders.push([header.key, header.value])
  return header
}
const decodeRecord = require(recordPath)
require.cache[recordPath].exports = (decoder, batchContext) => {
  decodedHeaders = []
  const record = decodeRecord(decoder, batchContext)
  Object.defineProperty(record, 'orderedHeaders', { value: decodedHeaders, enumerable: false })
  decodedHeaders = []
  return record
}

const { Kafka, CompressionTypes, CompressionCodecs, logLevel } = require('kafkajs')
const SnappyCodec = require('kafkajs-snappy')
const LZ4Codec = require('kafkajs-lz4')
const zstdModulePath = path.join(
  path.dirname(require.resolve('@bokuweb/zstd-wasm')),
  'module.js'
)
const zstd = require('@bokuweb/zstd-wasm')

// --- codecs -------------------------------------------------------------------------------------

let zstdReady = null
function zstdModule() {
  // The same module instance index.node.js initialises (required by absolute path: the package's
  // "exports" hide it); used directly to decompress frames of any size and several frames.
  return require(zstdModulePath).Module
}

function zstdDecompress(buffer) {
  const Module = zstdModule()
  const src = Module._malloc(buffer.length)
  Module.HEAPU8.set(buffer, src)
  try {
    // Kafka producers (librdkafka, zstd-jni streams) usually omit the content size: grow the
    // output until ZSTD_decompress fits.
    for (let capacity = Math.max(64 * 1024, buffer.length * 8); ; capacity *= 2) {
      if (capacity > 1024 * 1024 * 1024) throw new Error('zstd: output larger than 1 GiB')
      const dst = Module._malloc(capacity)
      try {
        const size = Module._ZSTD_decompress(dst, capacity, src, buffer.length)
        if (!Module._ZSTD_isError(size)) {
          return Buffer.from(Module.HEAPU8.slice(dst, dst + (size >>> 0)))
        }
      } finally {
        Module._free(dst)
      }
    }
  } finally {
    Module._free(src)
  }
}

const ZstdCodec = () => ({
  async compress(encoder) {
    await zstdReady
    return Buffer.from(zstd.compress(encoder.buffer, 3))
  },
  async decompress(buffer) {
    await zstdReady
    return zstdDecompress(buffer)
  },
})

CompressionCodecs[CompressionTypes.Snappy] = SnappyCodec
CompressionCodecs[CompressionTypes.LZ4] = new LZ4Codec().codec
CompressionCodecs[CompressionTypes.ZSTD] = ZstdCodec

const COMPRESSION = {
  none: CompressionTypes.None,
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
}

// --- helpers ------------------------------------------------------------------------------------

class Refused extends Error {}

const b64 = data => (data === null || data === undefined ? null : Buffer.from(data).toString('base64'))
const unb64 = text => (text === null || text === undefined ? null : Buffer.from(text, 'base64'))
const print = object => process.stdout.write(JSON.stringify(object) + '\n')

// The kafkajs `ssl` and `sasl` options of the environment's settings (see the header); {} without.
const PROTOCOLS = {
  PLAINTEXT: { tls: false, sasl: false },
  SSL: { tls: true, sasl: false },
  SASL_PLAINTEXT: { tls: false, sasl: true },
  SASL_SSL: { tls: true, sasl: true },
}
const MECHANISMS = {
  'SCRAM-SHA-512': 'scram-sha-512',
  'SCRAM-SHA-256': 'scram-sha-256',
  PLAIN: 'plain',
}

function security(env = process.env) {
  const variable = name => env[`KAFSCALE_DRIVER_${name}`] || ''
  const protocol = variable('SECURITY_PROTOCOL') || 'PLAINTEXT'
  const uses = PROTOCOLS[protocol]
  if (uses === undefined) {
    const known = Object.keys(PROTOCOLS).join(', ')
    throw new Refused(`KAFSCALE_DRIVER_SECURITY_PROTOCOL=${protocol}: want ${known}`)
  }
  const caFile = variable('CA_FILE')
  if (!uses.tls && caFile) throw new Refused(`KAFSCALE_DRIVER_CA_FILE: ${protocol} has no TLS`)
  const saslSet = ['SASL_MECHANISM', 'SASL_USERNAME', 'SASL_PASSWORD'].filter(variable)
  if (!uses.sasl && saslSet.length) {
    throw new Refused(`KAFSCALE_DRIVER_${saslSet[0]}: ${protocol} has no SASL`)
  }
  const options = {}
  if (uses.tls) options.ssl = caFile ? { ca: [fs.readFileSync(caFile, 'utf8')] } : true
  if (uses.sasl) {
    const mechanism = variable('SASL_MECHANISM') || 'SCRAM-SHA-512'
    if (!(mechanism in MECHANISMS)) {
      const known = Object.keys(MECHANISMS).join(', ')
      throw new Refused(`KAFSCALE_DRIVER_SASL_MECHANISM=${mechanism}: want ${known}`)
    }
    const username = variable('SASL_USERNAME')
    if (!username) throw new Refused(`KAFSCALE_DRIVER_SASL_USERNAME is required with ${protocol}`)
    const password = variable('SASL_PASSWORD')
    options.sasl = { mechanism: MECHANISMS[mechanism], username, password }
  }
  return options
}

function kafka(bootstrap, clientId) {
  return new Kafka({
    clientId,
    brokers: [bootstrap],
    ...security(),
    logLevel: logLevel.WARN,
    logCreator:
      () =>
      ({ namespace, level, label, log }) => {
        const { message, ...extra } = log
        process.stderr.write(
          `[kafkajs ${label}] ${namespace}: ${message} ${JSON.stringify(extra)}\n`
        )
      },
    retry: { retries: 8 },
  })
}

const INTEGER_LIKE = /^(0|[1-9][0-9]*)$/

function headersObject(pairs) {
  const object = {}
  let previous = null
  for (const [name, value] of pairs) {
    if (INTEGER_LIKE.test(name)) {
      throw new Refused(`kafkajs reorders integer-like header names: ${JSON.stringify(name)}`)
    }
    if (name in object && name !== previous) {
      throw new Refused(`kafkajs groups a repeated header name: ${JSON.stringify(name)}`)
    }
    const buffer = unb64(value)
    if (!(name in object)) object[name] = buffer
    else if (Array.isArray(object[name])) object[name].push(buffer)
    else object[name] = [object[name], buffer]
    previous = name
  }
  return object
}

function sameHeaders(ordered, object) {
  const grouped = {}
  for (const [name, value] of ordered) (grouped[name] = grouped[name] || []).push(value)
  const names = Object.keys(object)
  if (names.length !== Object.keys(grouped).length) return false
  return names.every(name => {
    const values = Array.isArray(object[name]) ? object[name] : [object[name]]
    const mine = grouped[name] || []
    return (
      values.length === mine.length &&
      values.every((v, i) => (v === null ? mine[i] === null : mine[i] !== null && v.equals(mine[i])))
    )
  })
}

// --- produce ------------------------------------------------------------------------------------

const CHUNK_BYTES = 512 * 1024

async function produce(command) {
  const compression = COMPRESSION[command.codec]
  if (compression === undefined) throw new Refused(`unknown codec ${command.codec}`)
  const messages = command.records.map(r => {
    const message = {
      partition: r.partition,
      key: unb64(r.key_b64),
      value: unb64(r.value_b64),
      headers: headersObject(r.headers || []),
    }
    if (r.timestamp !== null && r.timestamp !== undefined) message.timestamp = String(r.timestamp)
    return message
  })
  const producer = kafka(command.bootstrap, 'kafscale-kafkajs-producer').producer({
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: true,
  })
  await producer.connect()
  const acknowledged = new Array(messages.length).fill(null)
  try {
    // One send per chunk: kafkajs writes each partition's messages of a send as one batch, in
    // order, so a record's offset is the batch's base offset plus its rank in the partition.
    let start = 0
    while (start < messages.length) {
      let end = start
      let bytes = 0
      while (end < messages.length && (end === start || bytes < CHUNK_BYTES)) {
        bytes += (messages[end].value || []).length + (messages[end].key || []).length
        end += 1
      }
      const results = await producer.send({
        topic: command.topic,
        acks: -1,
        timeout: 30000,
        compression,
        messages: messages.slice(start, end),
      })
      const base = {}
      for (const result of results) {
        if (result.errorCode !== 0) {
          throw new Error(`partition ${result.partition}: error code ${result.errorCode}`)
        }
        base[result.partition] = BigInt(result.baseOffset)
      }
      const rank = {}
      for (let i = start; i < end; i++) {
        const partition = messages[i].partition
        if (base[partition] === undefined) throw new Error(`no result for partition ${partition}`)
        const offset = base[partition] + BigInt(rank[partition] || 0)
        rank[partition] = (rank[partition] || 0) + 1
        acknowledged[i] = { partition, offset: Number(offset) }
      }
      start = end
    }
  } finally {
    await producer.disconnect()
  }
  print({ acknowledged })
}

// --- consume ------------------------------------------------------------------------------------

async function startOffsets(admin, topics, start) {
  const offsets = {}
  for (const topic of topics) {
    let found
    if (start === 'earliest' || start === 'latest') {
      const watermarks = await admin.fetchTopicOffsets(topic)
      found = watermarks.map(w => ({
        partition: w.partition,
        offset: start === 'earliest' ? w.low : w.high,
      }))
    } else if (typeof start === 'number') {
      found = await admin.fetchTopicOffsetsByTimestamp(topic, start)
    } else {
      throw new Refused(`start must be "earliest", "latest" or a timestamp, not ${start}`)
    }
    offsets[topic] = Object.fromEntries(found.map(f => [f.partition, String(f.offset)]))
  }
  return offsets
}

async function consume(command) {
  const { bootstrap, topics, partitions, start, count } = command
  const deadline = Date.now() + command.timeout_ms
  const client = kafka(bootstrap, 'kafscale-kafkajs-consumer')
  const admin = client.admin()
  await admin.connect()
  let offsets
  try {
    offsets = await startOffsets(admin, topics, start)
  } finally {
    await admin.disconnect()
  }
  const wanted = new Set(partitions)
  const consumer = client.consumer({
    groupId: `kafscale-kafkajs-${process.pid}-${Date.now()}-${Math.random().toString(36).slice(2)}`,
    allowAutoTopicCreation: false,
    maxWaitTimeInMs: 200,
    retry: { retries: 8 },
  })
  let received = 0
  let finish
  const finished = new Promise(resolve => (finish = resolve))
  let crashed = null
  consumer.on(consumer.events.CRASH, event => {
    crashed = event.payload.error
    finish()
  })
  await consumer.connect()
  try {
    await consumer.subscribe({ topics, fromBeginning: true })
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: true,
      eachBatch: async ({ batch }) => {
        if (!wanted.has(batch.partition)) return
        for (const message of batch.messages) {
          if (received >= count) break
          const ordered = message.orderedHeaders
          if (ordered === undefined || !sameHeaders(ordered, message.headers)) {
            throw new Error(`headers of ${batch.topic}[${batch.partition}]@${message.offset} ` +
              'disagree with the decoder wrapper')
          }
          print({
            topic: batch.topic,
            partition: batch.partition,
            offset: Number(message.offset),
            key_b64: b64(message.key),
            value_b64: b64(message.value),
            headers: ordered.map(([name, value]) => [name, b64(value)]),
            timestamp: Number(message.timestamp),
          })
          received += 1
        }
        if (received >= count) finish()
      },
    })
    // run() returned after joining: batches fetched before a seek are discarded by kafkajs.
    for (const topic of topics) {
      for (const [partition, offset] of Object.entries(offsets[topic])) {
        consumer.seek({ topic, partition: Number(partition), offset })
      }
    }
    print({ ready: true, offsets })
    if (count > 0) {
      const timer = setTimeout(finish, Math.max(0, deadline - Date.now()))
      await finished
      clearTimeout(timer)
    }
    if (crashed) throw crashed
  } finally {
    await consumer.disconnect()
  }
  print({ done: true, received })
}

// --- main ---------------------------------------------------------------------------------------

async function readStdin() {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  return Buffer.concat(chunks).toString('utf8')
}

async function main() {
  const text = process.argv.length > 2 ? process.argv[2] : await readStdin()
  const command = JSON.parse(text)
  if (command.op === 'produce') await produce(command)
  else if (command.op === 'consume') await consume(command)
  else throw new Refused(`unknown op ${command.op}`)
}

// Exit once stdout is flushed: writes to a pipe are asynchronous and process.exit() would cut
// them (a long line of a 1 MiB value), while a callback runs after every earlier write.
const exit = code => process.stdout.write('', () => process.exit(code))

// Runs `body` (an async function), then exits 0; a Refused error exits 2, any other 1.
function runMain(body) {
  zstdReady = zstd.init()
  zstdReady.then(body).then(
    () => exit(0),
    error => {
      process.stderr.write(`${error instanceof Refused ? 'refused' : 'error'}: ${error.stack}\n`)
      exit(error instanceof Refused ? 2 : 1)
    }
  )
}

module.exports = { kafka, print, runMain, Refused }

if (require.main === module) runMain(main)
