; placement-logic proof obligation: composition/single-tensor-rules
; theorem: Composition
; single: tensor: composition rules CR01–CR08 hold (2 plans)
;   for each of the 2 compositions P in the family: CR01(P) ∧ … ∧ CR08(P), for all mesh sizes
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun cr07_T_microbatches () Int)
(declare-fun cr07_t_microbatches () Int)
(declare-fun size_microbatches () Int)
(declare-fun cr07_agree_microbatches () Bool)
(declare-fun size_x () Int)
(assert
 (let (($x32 (and false)))
(let ((?x17 (to_real 1)))
(let ((?x27 (+ (to_real cr07_t_microbatches) (to_real cr07_T_microbatches))))
(let (($x31 (or false (and (distinct (* (* 1.0 ?x17) ?x27) (* ?x27 ?x17)) true))))
(let (($x24 (= cr07_T_microbatches (* cr07_t_microbatches (- size_microbatches 1)))))
(let (($x21 (>= cr07_t_microbatches 1)))
(let (($x15 (= size_microbatches 1)))
(let (($x16 (=> $x15 cr07_agree_microbatches)))
(let (($x35 (or $x32 $x32 $x32 $x32 $x32 (and (and false (>= size_microbatches 2))) (and $x16 $x21 $x24 $x31) $x32)))
(let (($x9 (>= size_microbatches 1)))
(let (($x7 (>= size_x 1)))
(let (($x36 (and $x7 $x9 $x35)))
(or $x36 $x36))))))))))))))
(check-sat)
(exit)
