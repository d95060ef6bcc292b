#!/usr/bin/env node
// kafkajs as a consumer-group member and as an admin client, for the compatibility tests
// (tests/harness/kafkajs.py, tests/harness/groups.py).
//
//   node group.js group-consume --bootstrap B --topics T1,T2 --group G [--count N]
//       [--timeout-ms T] [--assignor roundrobin] [--commit after-processing|auto|none]
//       [--auto-offset-reset earliest|latest] [--exit-after-assigned-ms X] [--poll-ms P]
//       [--config session.timeout.ms=6000 ...]
//     The options and JSON-line events of the group tests' other members
//     (tests/harness/group_consumer.py): started, assigned / revoked, record, committed /
//     commit-failed, warning, done ({"consumed", "reason", "everAssigned"}). kafkajs rebalances
//     eagerly and says only what it was assigned after each join (GROUP_JOIN), so a join that
//     follows an assignment prints "revoked" (the old partitions) before "assigned". kafkajs has
//     only the round-robin assignor and no static membership: --assignor other than roundrobin
//     and --instance-id are refused (exit 2). SIGTERM commits, leaves the group and exits 0.
//
//   node group.js admin --bootstrap B --topic T --partitions N [--config k=v ...] [--group G]
//     creates T, creates it again, describes the cluster, the topic, its configs and (with
//     --group) the group and its committed offsets; prints one JSON object, the same as the
//     franz-go driver's `admin` (tests/compat/go/admin.go).
//
// Both connect as the KAFSCALE_DRIVER_* environment variables say (TLS, SASL; see driver.js).
'use strict'

const { kafka, print, runMain, Refused } = require('./driver.js')
const { ConfigResourceTypes, ConfigSource, PartitionAssigners } = require('kafkajs')

function parseOptions(argv) {
  const options = { config: [] }
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '')
    const value = argv[i + 1]
    if (value === undefined) throw new Refused(`option --${name} needs a value`)
    if (name === 'config') options.config.push(value)
    else options[name] = value
  }
  return options
}

const emit = (event, fields = {}) => print({ event, ...fields })
const text = data => (data === null || data === undefined ? null : data.toString('utf8'))
const partitionsOf = assignment =>
  Object.entries(assignment)
    .flatMap(([topic, partitions]) => partitions.map(partition => ({ topic, partition })))
    .sort((a, b) => (a.topic === b.topic ? a.partition - b.partition : a.topic < b.topic ? -1 : 1))

// Java property names as kafkajs consumer options.
function consumerConfig(pairs) {
  const names = {
    'session.timeout.ms': 'sessionTimeout',
    'heartbeat.interval.ms': 'heartbeatInterval',
    'max.poll.interval.ms': 'rebalanceTimeout',
  }
  const config = {}
  for (const pair of pairs) {
    const [key, value] = pair.split('=', 2)
    if (!(key in names)) throw new Refused(`--config ${pair}: the kafkajs driver does not know ${key}`)
    config[names[key]] = Number(value)
  }
  return config
}

async function groupConsume(options) {
  if (options.assignor !== undefined && options.assignor !== 'roundrobin') {
    throw new Refused(`kafkajs has no ${options.assignor} assignor (only roundrobin)`)
  }
  if (options['instance-id'] !== undefined) {
    throw new Refused('kafkajs has no static membership (group.instance.id)')
  }
  const commit = options.commit || 'after-processing'
  const count = options.count === undefined ? -1 : Number(options.count)
  const deadline = Date.now() + Number(options['timeout-ms'] || 60000)
  const exitAfter = Number(options['exit-after-assigned-ms'] ?? -1)
  const topics = options.topics.split(',')
  const consumer = kafka(options.bootstrap, 'kafscale-kafkajs-member').consumer({
    groupId: options.group,
    allowAutoTopicCreation: false,
    maxWaitTimeInMs: Number(options['poll-ms'] || 200),
    partitionAssigners: [PartitionAssigners.roundRobin],
    ...consumerConfig(options.config),
  })
  let consumed = 0
  let everAssigned = false
  let stopAt = Infinity
  let owned = {}
  let reason = null
  let wake
  const stopped = new Promise(resolve => (wake = resolve))
  const stop = why => {
    if (reason === null) reason = why
    wake()
  }
  process.on('SIGTERM', () => stop('signal'))
  process.on('SIGINT', () => stop('signal'))
  consumer.on(consumer.events.CRASH, event => {
    emit('error', { message: String(event.payload.error) })
    stop('error')
  })
  consumer.on(consumer.events.GROUP_JOIN, ({ payload }) => {
    const ids = { memberId: payload.memberId, generationId: null } // kafkajs hides the generation
    const old = partitionsOf(owned)
    if (old.length) emit('revoked', { partitions: old, ...ids })
    owned = payload.memberAssignment
    const now = partitionsOf(owned)
    if (now.length && !everAssigned) {
      everAssigned = true
      if (exitAfter >= 0) stopAt = Date.now() + exitAfter
    }
    emit('assigned', { partitions: now, ...ids })
  })
  const ticker = setInterval(() => {
    if (Date.now() >= stopAt) stop('assigned-time')
    else if (Date.now() >= deadline) stop('timeout')
  }, 50)

  await consumer.connect()
  await consumer.subscribe({ topics, fromBeginning: options['auto-offset-reset'] !== 'latest' })
  emit('started', { group: options.group, topics })
  await consumer.run({
    autoCommit: commit === 'auto',
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning }) => {
      let next = null
      for (const message of batch.messages) {
        if (!isRunning() || reason !== null || (count >= 0 && consumed >= count)) break
        emit('record', {
          topic: batch.topic,
          partition: batch.partition,
          offset: Number(message.offset),
          key: text(message.key),
          value: text(message.value),
        })
        consumed += 1
        next = Number(message.offset) + 1
        resolveOffset(message.offset)
      }
      if (count >= 0 && consumed >= count) stop('count')
      if (next === null || commit !== 'after-processing') return
      const offsets = [{ topic: batch.topic, partition: batch.partition, offset: String(next) }]
      const listed = [{ topic: batch.topic, partition: batch.partition, offset: next }]
      try {
        await consumer.commitOffsets(offsets)
        emit('committed', { offsets: listed })
      } catch (error) {
        emit('commit-failed', { error: error.name, message: error.message, offsets: listed })
      }
      await heartbeat()
    },
  })
  await stopped
  clearInterval(ticker)
  await consumer.disconnect() // stops fetching, leaves the group
  emit('done', { consumed, reason, everAssigned })
}

async function admin(options) {
  const client = kafka(options.bootstrap, 'kafscale-kafkajs-admin').admin()
  await client.connect()
  try {
    const result = {}
    const configEntries = options.config.map(pair => {
      const [name, value] = pair.split('=', 2)
      return { name, value }
    })
    const spec = {
      topic: options.topic,
      numPartitions: Number(options.partitions || 1),
      replicationFactor: 1,
      configEntries,
    }
    for (const field of ['created', 'created_again']) {
      try {
        // createTopics resolves false (no error) for a topic that already exists
        const created = await client.createTopics({ topics: [spec], waitForLeaders: true })
        result[field] = created ? null : 'TOPIC_ALREADY_EXISTS'
      } catch (error) {
        result[field] = error.type || error.message
      }
    }
    const cluster = await client.describeCluster()
    result.cluster = {
      controller: cluster.controller,
      brokers: cluster.brokers.map(b => ({ id: b.nodeId, host: b.host, port: b.port })),
    }
    const { topics } = await client.fetchTopicMetadata({ topics: [options.topic] })
    result.topic = {
      partitions: topics[0].partitions
        .map(p => ({ partition: p.partitionId, leader: p.leader, replicas: p.replicas }))
        .sort((a, b) => a.partition - b.partition),
    }
    const described = await client.describeConfigs({
      resources: [{ type: ConfigResourceTypes.TOPIC, name: options.topic }],
      includeSynonyms: false,
    })
    const sourceNames = Object.fromEntries(Object.entries(ConfigSource).map(([k, v]) => [v, k]))
    result.configs = Object.fromEntries(
      described.resources[0].configEntries.map(entry => [
        entry.configName,
        { value: entry.configValue, source: sourceNames[entry.configSource] ?? null },
      ])
    )
    if (options.group !== undefined) {
      const { groups } = await client.describeGroups([options.group])
      result.group = {
        state: groups[0].state,
        protocol_type: groups[0].protocolType,
        members: groups[0].members.length,
      }
      const fetched = await client.fetchOffsets({ groupId: options.group })
      result.offsets = fetched
        .flatMap(({ topic, partitions }) =>
          partitions.map(p => ({ topic, partition: p.partition, offset: Number(p.offset) }))
        )
        .sort((a, b) => a.partition - b.partition)
    }
    print(result)
  } finally {
    await client.disconnect()
  }
}

const [command, ...rest] = process.argv.slice(2)
runMain(async () => {
  const options = parseOptions(rest)
  if (command === 'group-consume') await groupConsume(options)
  else if (command === 'admin') await admin(options)
  else throw new Refused(`unknown command ${command} (group-consume or admin)`)
})
