export function handler(event) {
  console.log('NESTED ' + event.n);
}
