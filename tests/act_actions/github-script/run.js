// github-script's globals (require, github, context) with the API calls written to a log.
const fs = require('fs');
const path = require('path');
const log = path.join(process.env.VERIFY_ATTN_ACT_STORE, 'github-api.jsonl');
const event = JSON.parse(fs.readFileSync(process.env.GITHUB_EVENT_PATH, 'utf8'));
const [owner, repo] = process.env.GITHUB_REPOSITORY.split('/');
const context = { repo: { owner, repo }, issue: { owner, repo, number: (event.pull_request || event).number } };
const call = (name) => async (args) => { fs.appendFileSync(log, JSON.stringify({ call: name, ...args }) + '\n'); return { data: [] }; };
const github = {
  paginate: async (fn, args) => (await fn(args)).data,
  rest: { issues: { listComments: call('listComments'), createComment: call('createComment'), updateComment: call('updateComment') } },
};
const AsyncFunction = Object.getPrototypeOf(async function () {}).constructor;
new AsyncFunction('require', 'github', 'context', process.env.SCRIPT)(require, github, context)
  .catch((e) => { console.error(e); process.exit(1); });
