// One Rank call to recsys-rl from Node.js, the way a production Node caller makes it: the protos are
// loaded from protos/ by their import paths (run from the repository root), the call goes over
// @grpc/grpc-js, and the answer is printed as JSON on stdout.
//
//   node tests/node/rank.js HOST:PORT '{"schema_version": 1, "request_id": "r1", ...}'
'use strict';
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [target, requestJson] = process.argv.slice(2);
const definition = protoLoader.loadSync('recsys/v1/serving.proto', {
  includeDirs: ['protos'],
  keepCase: true, // field names as in the .proto (request_id), not camelCase
  enums: String, // ROUTING_ARM_FALLBACK rather than 4
  longs: String,
  defaults: true,
});
const { RankingService } = grpc.loadPackageDefinition(definition).recsys.v1;
const client = new RankingService(target, grpc.credentials.createInsecure());

client.Rank(JSON.parse(requestJson), { deadline: Date.now() + 30_000 }, (err, response) => {
  client.close();
  if (err) {
    console.error(`Rank failed: ${grpc.status[err.code]}: ${err.details}`);
    process.exit(1);
  }
  console.log(JSON.stringify(response));
});
